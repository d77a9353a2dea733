// generation_config.json as vLLM reads it (--generation-config auto): extra eos ids and
// defaults for the sampling fields a request leaves out.
#include <gtest/gtest.h>

#include "core/error.h"
#include "server/generation_config.h"

using namespace moeserve::server;
using nlohmann::json;

TEST(GenerationConfig, ReadsEosAndSamplingDefaults) {
  // The shape Qwen3.5 checkpoints ship (../shared/spec/qwen35_arch.md section 1).
  const auto g = parse_generation_config(
      json::parse(R"({"do_sample": true, "eos_token_id": [248046, 248044], "pad_token_id": 248044,
                      "temperature": 0.6, "top_k": 20, "top_p": 0.95})"),
      "generation_config.json");
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{248046, 248044}));
  EXPECT_EQ(g.defaults.temperature, 0.6);
  EXPECT_EQ(g.defaults.top_p, 0.95);
  EXPECT_EQ(g.defaults.top_k, 20);
  EXPECT_FALSE(g.defaults.min_p);
  EXPECT_FALSE(g.defaults.max_tokens);
  EXPECT_EQ(parse_generation_config(json::parse(R"({"eos_token_id": 7})"), "x").eos_token_ids,
            std::vector<int32_t>{7});
  EXPECT_THROW(parse_generation_config(json::parse(R"({"top_p": 0})"), "x"), moeserve::Error);
  EXPECT_THROW(parse_generation_config(json::parse(R"({"eos_token_id": ["a"]})"), "x"), moeserve::Error);
}

TEST(GenerationConfig, DefaultsApplyOnlyToFieldsTheRequestLeavesOut) {
  SamplingDefaults d;
  d.temperature = 0.6;
  d.top_k = 20;
  d.max_tokens = 5;
  RequestLimits limits;
  limits.max_model_len = 100;
  const json body = {{"top_k", 3}};
  auto o = parse_generation_options(JsonFields(body), limits, Endpoint::Chat, d);
  EXPECT_EQ(o.sampling.temperature, 0.6);
  EXPECT_EQ(o.sampling.top_k, 3);
  finalize_max_tokens(o, 10, limits, Endpoint::Chat);
  EXPECT_EQ(o.sampling.max_tokens, 5);  // the model's cap, not the rest of the context
  const json explicit_max = {{"max_tokens", 50}};
  auto e = parse_generation_options(JsonFields(explicit_max), limits, Endpoint::Chat, d);
  finalize_max_tokens(e, 10, limits, Endpoint::Chat);
  EXPECT_EQ(e.sampling.max_tokens, 50);  // a request's own value wins
}
