// Structured output through the engine over a real model (the CPU reference or the CUDA
// model on a tiny fixture checkpoint, random weights): the model's token ids get a synthetic
// vocabulary (JSON pieces and every printable ASCII byte), so its own preferences choose among
// the tokens the grammar allows. Every answer must be compact JSON of the schema, ended by the
// stop token; a greedy answer must be the same alone and in a batch.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "../runtime/engine_test_util.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "structured/json_constraint.h"
#include "structured/json_schema_compiler.h"

namespace moeserve::structured::testing {

// Token `stop` ends answers; ids the pieces do not reach are unused.
struct SyntheticVocabulary {
  std::vector<std::optional<std::string>> tokens;
  int32_t stop = 0;

  explicit SyntheticVocabulary(int64_t vocab_size) : tokens(size_t(vocab_size)) {
    std::vector<std::string> pieces = {"{", "}", "[", "]", ":", ",", "\"", "{\"", "\":", "\",\"", "\"}", "ok",
                                       "color", "tags", "note", "true", "false", "null", "red", "green", "blue"};
    for (char c = 0x20; c < 0x7f; ++c) pieces.emplace_back(1, c);
    stop = int32_t(vocab_size - 1);
    for (size_t i = 0; i < pieces.size() && i + 1 < tokens.size(); ++i) tokens[i + 1] = pieces[i];
  }
  std::string text(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t t : ids)
      if (t != stop && tokens[size_t(t)]) out += *tokens[size_t(t)];
    return out;
  }
};

// Eight sequences, 64 tokens a step, fixed cache sizes (no memory budget), a fixed seed.
inline runtime::EngineConfig small_engine_config(int max_model_len, int kv_blocks, uint64_t seed) {
  runtime::EngineConfig config;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 64;
  config.max_model_len = max_model_len;
  config.num_kv_blocks_override = kv_blocks;
  config.num_state_slots_override = 8;
  config.kv_admission_watermark = 0.0;
  config.seed = seed;
  return config;
}

inline void check_json_answers(std::unique_ptr<model::CausalLM> model) {
  using runtime::testing::Recorder;
  const int64_t vocab_size = model->config().vocab_size;
  ASSERT_GE(vocab_size, 128) << "the synthetic vocabulary needs 128 ids";
  const SyntheticVocabulary words(vocab_size);
  JsonGrammar grammar = compile_json_schema(nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "ok":{"type":"boolean"},"color":{"enum":["red","green","blue"]},
      "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3},"note":{"type":"null"}},
      "required":["ok","color","tags","note"]})"));
  grammar.max_whitespace = 0;  // compact: every answer fits in max_tokens
  auto masker = std::make_shared<const TokenMasker>(std::move(grammar),
                                                    std::make_shared<TokenVocabulary>(words.tokens, vocab_size));
  runtime::Engine engine(std::move(model), small_engine_config(256, 256, 7));

  runtime::SamplingParams params;
  params.max_tokens = 120;
  params.ignore_eos = true;  // the fixture's eos ids are pieces here: only `stop` ends
  params.stop_token_ids = {words.stop};
  params.constraint = std::make_shared<JsonConstraintFactory>(masker, std::nullopt);
  auto check = [&](const Recorder& rec) {
    const auto last = rec.last();
    ASSERT_EQ(last.finish, runtime::FinishReason::Stop) << last.error << " after " << words.text(rec.tokens());
    ASSERT_EQ(rec.tokens().back(), words.stop);
    const std::string text = words.text(rec.tokens());
    const auto v = nlohmann::ordered_json::parse(text);
    EXPECT_EQ(v.dump(), text) << "compact, keys in the schema's order";
    ASSERT_TRUE(v["ok"].is_boolean()) << text;
    EXPECT_TRUE(v["color"] == "red" || v["color"] == "green" || v["color"] == "blue") << text;
    EXPECT_LE(v["tags"].size(), 3u) << text;
    EXPECT_TRUE(v["note"].is_null()) << text;
  };
  const std::vector<int32_t> prompt = {3, 9, 27, 81, 11};
  std::vector<std::shared_ptr<Recorder>> batch;
  for (int i = 0; i < 4; ++i) {
    runtime::SamplingParams p = params;
    if (i >= 2) {
      p.temperature = 1.0;
      p.seed = uint64_t(i);
    } else {
      p.temperature = 0;
    }
    std::vector<int32_t> ids = prompt;
    ids.push_back(int32_t(40 + i % 2));
    auto rec = Recorder::create();
    engine.submit(ids, p, rec->callback());
    batch.push_back(rec);
  }
  for (auto& rec : batch) {
    ASSERT_TRUE(rec->wait());
    check(*rec);
  }
  runtime::SamplingParams greedy = params;
  greedy.temperature = 0;
  std::vector<int32_t> ids = prompt;
  ids.push_back(40);
  auto alone = Recorder::create();
  engine.submit(ids, greedy, alone->callback());
  ASSERT_TRUE(alone->wait());
  check(*alone);
  EXPECT_EQ(alone->tokens(), batch[0]->tokens()) << "a greedy answer changed with its batch";
}

}  // namespace moeserve::structured::testing
