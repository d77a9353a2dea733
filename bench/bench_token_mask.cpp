// Structured output's cost per generated token on the real Qwen3 vocabulary (151,669 ids;
// third_party/tokenizers/qwen3, fetched by scripts/install-deps.sh).
//
//   BM_BuildVocabulary  once per server: token bytes, the two tries, the plain-token bitset.
//   BM_Mask/<state>     one uncached mask (a trie walk) at a typical state of a JSON text.
//   BM_Generate/<cache> what a sequence pays per token in the sampler: mask_logits over a
//                       151,669-float row, then accept, along a tokenized JSON answer; with a
//                       warm cache (steady state, as for repeated shapes and long strings) and
//                       with a fresh masker every pass (every state computed once). Each
//                       token also refills the row (a 600 KB write, as the sampler's copy;
//                       BM_RowRefill times it alone).
// There is no bandwidth roofline here: the budget is the decode step (a few ms at batch 1
// on the H200), which the per-token cost must stay well under.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "structured/json_constraint.h"
#include "structured/json_schema_compiler.h"
#include "structured/token_mask.h"
#include "text/tokenizer.h"

namespace {

using namespace moeserve::structured;
using moeserve::text::Tokenizer;

const std::filesystem::path kQwen3Dir = std::filesystem::path(MOESERVE_SOURCE_DIR) / "third_party/tokenizers/qwen3";

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load(kQwen3Dir);
  return t;
}
const std::shared_ptr<const TokenVocabulary>& vocabulary() {
  static const auto v = TokenVocabulary::from_tokenizer(tokenizer(), tokenizer().vocab_size());
  return v;
}

const char* kAnswer =
    "{\n  \"city\": \"Paris\",\n  \"country\": \"France\",\n  \"population\": 2102650,\n"
    "  \"summary\": \"Paris is the capital and largest city of France, on the Seine; it is known for "
    "its museums, its architecture and the \\\"City of Light\\\" nickname.\",\n"
    "  \"landmarks\": [\"Eiffel Tower\", \"Louvre\", \"Notre-Dame\"],\n  \"is_capital\": true\n}";

const char* kSchema = R"({"type":"object","properties":{
    "city":{"type":"string"},"country":{"type":"string"},"population":{"type":"integer"},
    "summary":{"type":"string"},"landmarks":{"type":"array","items":{"type":"string"}},
    "is_capital":{"type":"boolean"}},
    "required":["city","country","population","summary","landmarks","is_capital"]})";

void BM_BuildVocabulary(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(TokenVocabulary::from_tokenizer(tokenizer(), tokenizer().vocab_size()));
}
BENCHMARK(BM_BuildVocabulary)->Unit(benchmark::kMillisecond);

void BM_Mask(benchmark::State& state, const char* prefix) {
  const TokenMasker masker(any_json_object(), vocabulary());
  MatchState s = masker.matcher().start();
  if (!masker.matcher().feed_all(s, prefix)) {
    state.SkipWithError("prefix refused");
    return;
  }
  size_t allowed = 0;
  for (auto _ : state) {
    const TokenMask mask = masker.compute(s);
    allowed = 0;
    for (uint64_t w : mask) allowed += size_t(__builtin_popcountll(w));
    benchmark::DoNotOptimize(allowed);
  }
  state.counters["allowed_tokens"] = double(allowed);
}
BENCHMARK_CAPTURE(BM_Mask, start, "")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Mask, after_brace, "{")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Mask, in_key, "{\"ci")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Mask, after_colon, "{\"city\":")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Mask, in_string, "{\"city\": \"Par")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Mask, in_number, "{\"n\": 21")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Mask, after_value, "{\"n\": \"x\"")->Unit(benchmark::kMicrosecond);

void BM_Generate(benchmark::State& state, bool schema, bool warm) {
  const std::vector<int32_t> ids = tokenizer().encode(kAnswer);
  const std::vector<int32_t> ends = {*tokenizer().token_to_id("<|im_end|>")};
  auto grammar = [&] {
    return schema ? compile_json_schema(nlohmann::ordered_json::parse(kSchema)) : any_json_object();
  };
  auto masker = std::make_shared<const TokenMasker>(grammar(), vocabulary());
  std::vector<float> logits(size_t(vocabulary()->size()));
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      masker = std::make_shared<const TokenMasker>(grammar(), vocabulary());
      state.ResumeTiming();
    }
    auto constraint = JsonConstraintFactory(masker, std::nullopt).start();
    for (int32_t id : ids) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      constraint->mask_logits(logits, ends);
      if (logits[size_t(id)] == -std::numeric_limits<float>::infinity()) {
        state.SkipWithError("the answer's own token was masked");
        return;
      }
      constraint->accept(id, ends);
    }
  }
  state.counters["tokens"] = double(ids.size());
  state.counters["per_token"] = benchmark::Counter(
      double(ids.size()), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
// The row refill alone, as in BM_Generate without the constraint: what to subtract.
void BM_RowRefill(benchmark::State& state) {
  const size_t tokens = tokenizer().encode(kAnswer).size();
  std::vector<float> logits(size_t(vocabulary()->size()));
  for (auto _ : state)
    for (size_t i = 0; i < tokens; ++i) {
      std::fill(logits.begin(), logits.end(), float(i));
      benchmark::DoNotOptimize(logits.data());
      benchmark::ClobberMemory();
    }
  state.counters["per_token"] =
      benchmark::Counter(double(tokens), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_RowRefill)->Unit(benchmark::kMicrosecond);

BENCHMARK_CAPTURE(BM_Generate, json_object_warm, false, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Generate, json_object_cold, false, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Generate, schema_warm, true, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Generate, schema_cold, true, false)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
