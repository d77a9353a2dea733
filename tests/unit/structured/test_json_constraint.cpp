// JsonConstraint on its own (masks, end tokens, accept, waiting for </think>), and inside the
// engine: a deterministic stand-in model (tests/unit/runtime/hash_model.h) whose logits
// ignore JSON entirely still produces valid JSON of the schema, greedy and sampled, alone and
// in a batch, and the host sampler keeps the constrained rows off the device path.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "../runtime/engine_test_util.h"
#include "core/error.h"
#include "json_engine_check.h"
#include "model/qwen35_cpu.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "structured/json_constraint.h"
#include "structured/json_schema_compiler.h"

namespace moeserve::structured {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Token 0 is the end of sequence (not usable inside JSON); the others are JSON pieces, and
// (as in a byte-level BPE vocabulary) every printable ASCII byte on its own, so that any
// text the grammar allows can be spelled.
std::vector<std::string> make_pieces() {
  std::vector<std::string> pieces = {
      "{", "}", "[", "]", ":", ",", "\"", "{\"", "\":", "\": \"", "\",\"", "\"}", " ", "\n", "a", "b", "name",
      "age", "tags", "true", "false", "null", "0", "1", "7", "-", ".", "5", "e", "\\n", "\\\"", "x\"", "\xC3\xA9",
  };
  for (char c = 0x20; c < 0x7f; ++c)
    if (std::find(pieces.begin(), pieces.end(), std::string(1, c)) == pieces.end()) pieces.emplace_back(1, c);
  return pieces;
}
const std::vector<std::string> kPieces = make_pieces();
constexpr int32_t kEos = 0;

std::shared_ptr<const TokenVocabulary> vocabulary() {
  std::vector<std::optional<std::string>> tokens = {std::nullopt};  // id 0: eos
  for (const auto& p : kPieces) tokens.push_back(p);
  return std::make_shared<TokenVocabulary>(tokens, int64_t(tokens.size()));
}

std::string text_of(const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens)
    if (t != kEos) out += kPieces[size_t(t - 1)];
  return out;
}

int32_t id_of(const std::string& piece) {
  return int32_t(std::find(kPieces.begin(), kPieces.end(), piece) - kPieces.begin()) + 1;
}

TEST(JsonConstraint, MasksAcceptsAndEndsOnlyWhenComplete) {
  auto masker = std::make_shared<const TokenMasker>(any_json_object(), vocabulary());
  auto c = JsonConstraintFactory(masker, std::nullopt).start();
  const std::vector<int32_t> ends = {kEos};
  const auto vocab = int64_t(kPieces.size()) + 1;
  std::vector<float> logits(size_t(vocab), 1.0f);
  c->mask_logits(logits, ends);
  EXPECT_EQ(logits[size_t(kEos)], kNegInf);
  EXPECT_EQ(logits[size_t(id_of("{"))], 1.0f);
  EXPECT_EQ(logits[size_t(id_of("{\""))], 1.0f);
  EXPECT_EQ(logits[size_t(id_of(" "))], 1.0f);
  EXPECT_EQ(logits[size_t(id_of("["))], kNegInf);
  EXPECT_EQ(logits[size_t(id_of("a"))], kNegInf);
  EXPECT_THROW(c->accept(id_of("["), ends), Error);

  auto d = JsonConstraintFactory(masker, std::nullopt).start();
  for (const char* piece : {"{\"", "a", "\":", "1", "}"}) d->accept(id_of(piece), ends);
  std::fill(logits.begin(), logits.end(), 2.0f);
  d->mask_logits(logits, ends);
  EXPECT_EQ(logits[size_t(kEos)], 2.0f);  // complete: only the end is left
  for (int64_t t = 1; t < vocab; ++t) EXPECT_EQ(logits[size_t(t)], kNegInf) << kPieces[size_t(t - 1)];
  d->accept(kEos, ends);
  // Complete, and nothing to end with: a clear error instead of "every token is masked".
  try {
    d->mask_logits(logits, {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no end-of-sequence or stop token"), std::string::npos) << e.what();
  }
}

TEST(JsonConstraint, WaitsForTheStartToken) {
  auto masker = std::make_shared<const TokenMasker>(any_json_object(), vocabulary());
  const int32_t think_end = id_of("a");  // stands for </think> here
  auto c = JsonConstraintFactory(masker, think_end).start();
  const std::vector<int32_t> ends = {kEos};
  std::vector<float> logits(kPieces.size() + 1, 1.0f);
  c->mask_logits(logits, ends);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return v == 1.0f; }));
  c->accept(id_of("["), ends);  // free text while thinking
  c->accept(kEos, ends);
  c->accept(think_end, ends);
  c->mask_logits(logits, ends);
  EXPECT_EQ(logits[size_t(id_of("["))], kNegInf);
  EXPECT_EQ(logits[size_t(id_of("{"))], 1.0f);
  EXPECT_THROW(c->accept(id_of("a"), ends), Error);
}

TEST(JsonConstraint, SequencesWithAConstraintStayOnTheHost) {
  auto masker = std::make_shared<const TokenMasker>(any_json_object(), vocabulary());
  runtime::SamplingParams p;
  p.temperature = 0;
  runtime::SampleInput in;
  in.params = &p;
  runtime::Rng rng(1);
  in.rng = &rng;
  std::vector<int32_t> masked;
  EXPECT_TRUE(runtime::to_device_sample(in, 40, masked).has_value());
  p.constraint = std::make_shared<JsonConstraintFactory>(masker, std::nullopt);
  EXPECT_FALSE(runtime::to_device_sample(in, 40, masked).has_value());
}

// The engine with a model that knows nothing of JSON: every finished output is valid JSON of
// the grammar, and a greedy request gives the same tokens alone and in a batch.
TEST(JsonConstraint, EngineOutputsFollowTheSchema) {
  using runtime::testing::HashModel;
  using runtime::testing::Recorder;
  HashModel::Options options;
  options.vocab = int64_t(kPieces.size()) + 1;
  options.eos = {kEos};
  runtime::Engine engine(std::make_unique<HashModel>(options), testing::small_engine_config(512, 1024, 3));

  const auto schema = nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":5},"age":{"type":"integer"},
      "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},"required":["name","age"]})");
  auto masker = std::make_shared<const TokenMasker>(compile_json_schema(schema), vocabulary());
  runtime::SamplingParams params;
  params.max_tokens = 400;
  params.constraint = std::make_shared<JsonConstraintFactory>(masker, std::nullopt);

  auto check = [&](const std::vector<int32_t>& tokens) {
    ASSERT_FALSE(tokens.empty());
    ASSERT_EQ(tokens.back(), kEos);
    const std::string text = text_of(tokens);
    const auto v = nlohmann::json::parse(text);
    ASSERT_TRUE(v.is_object()) << text;
    ASSERT_TRUE(v["name"].is_string()) << text;
    ASSERT_TRUE(v["age"].is_number_integer()) << text;
    if (v.contains("tags")) {
      ASSERT_LE(v["tags"].size(), 3u) << text;
      for (const auto& t : v["tags"]) EXPECT_TRUE(t == "a" || t == "b") << text;
    }
    EXPECT_LE(v.size(), 3u) << text;
  };

  std::vector<std::shared_ptr<Recorder>> batch;
  for (int i = 0; i < 8; ++i) {
    runtime::SamplingParams p = params;
    if (i % 2) {
      p.temperature = 1.0;
      p.seed = uint64_t(i);
    } else {
      p.temperature = 0;
    }
    auto rec = Recorder::create();
    engine.submit({id_of("a"), id_of("b"), int32_t(1 + i)}, p, rec->callback());
    batch.push_back(rec);
  }
  for (auto& rec : batch) {
    ASSERT_TRUE(rec->wait());
    ASSERT_EQ(rec->last().finish, runtime::FinishReason::Stop) << rec->last().error << text_of(rec->tokens());
    check(rec->tokens());
  }
  // Greedy alone == greedy in the batch.
  runtime::SamplingParams greedy = params;
  greedy.temperature = 0;
  auto alone = Recorder::create();
  engine.submit({id_of("a"), id_of("b"), 1}, greedy, alone->callback());
  ASSERT_TRUE(alone->wait());
  EXPECT_EQ(alone->tokens(), batch[0]->tokens());
}

// The same through the CPU reference model on a fixture checkpoint (tests/gpu runs it on the
// CUDA model, whose constrained rows come back to the host).
TEST(JsonConstraint, Qwen35FixtureModelAnswersFollowTheSchema) {
  const auto dir = std::filesystem::path(MOESERVE_FIXTURES_DIR) / "qwen35" / "hybrid_int4_fp8";
  if (!std::filesystem::exists(dir / "model.safetensors.index.json")) GTEST_SKIP() << "fixture missing: " << dir;
  model::CpuModelOptions options;
  options.threads = 2;
  options.load_mtp = false;
  testing::check_json_answers(model::Qwen35CpuModel::load(dir, options));
}

}  // namespace
}  // namespace moeserve::structured
