#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "runtime/request_validation.h"

namespace moeserve::runtime {
namespace {

std::string error_of(std::vector<int32_t> prompt, const SamplingParams& p, int max_model_len = 100) {
  EngineConfig c;
  c.max_model_len = max_model_len;
  try {
    validate_request(prompt, p, 50, c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool mentions(const std::string& message, const std::string& what) { return message.find(what) != std::string::npos; }

TEST(RequestValidation, AcceptsAnOrdinaryRequest) {
  SamplingParams p;
  p.max_tokens = 90;
  p.logit_bias[3] = -100.0f;
  p.stop_token_ids = {49};
  p.logprobs = 20;
  EXPECT_EQ(error_of({1, 2, 3}, p), "");
}

TEST(RequestValidation, RejectsBadPrompts) {
  SamplingParams p;
  EXPECT_TRUE(mentions(error_of({}, p), "prompt is empty"));
  EXPECT_TRUE(mentions(error_of({1, 50}, p), "prompt token 1 has id 50"));
  EXPECT_TRUE(mentions(error_of({-1}, p), "id -1"));
}

TEST(RequestValidation, RejectsRequestsLongerThanTheContext) {
  SamplingParams p;
  p.max_tokens = 98;
  EXPECT_EQ(error_of({1, 2}, p), "");
  p.max_tokens = 99;
  const std::string msg = error_of({1, 2}, p);
  EXPECT_TRUE(mentions(msg, "maximum context length is 100 tokens")) << msg;
  EXPECT_TRUE(mentions(msg, "101 tokens were requested (2 in the prompt, 99 for the completion)")) << msg;
}

TEST(RequestValidation, RejectsOutOfRangeParameters) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    void (*set)(SamplingParams&, double);
    double value;
    const char* field;
  };
  const Case cases[] = {
      {[](SamplingParams& p, double v) { p.max_tokens = int(v); }, 0, "max_tokens"},
      {[](SamplingParams& p, double v) { p.min_tokens = int(v); }, 17, "min_tokens"},
      {[](SamplingParams& p, double v) { p.min_tokens = int(v); }, -1, "min_tokens"},
      {[](SamplingParams& p, double v) { p.temperature = v; }, -0.5, "temperature"},
      {[](SamplingParams& p, double v) { p.temperature = v; }, nan, "temperature"},
      {[](SamplingParams& p, double v) { p.top_p = v; }, 0.0, "top_p"},
      {[](SamplingParams& p, double v) { p.top_p = v; }, 1.01, "top_p"},
      {[](SamplingParams& p, double v) { p.top_k = int(v); }, -2, "top_k"},
      {[](SamplingParams& p, double v) { p.min_p = v; }, 1.5, "min_p"},
      {[](SamplingParams& p, double v) { p.presence_penalty = v; }, 2.5, "presence_penalty"},
      {[](SamplingParams& p, double v) { p.frequency_penalty = v; }, -3, "frequency_penalty"},
      {[](SamplingParams& p, double v) { p.repetition_penalty = v; }, 0.0, "repetition_penalty"},
      {[](SamplingParams& p, double v) { p.logprobs = int(v); }, 21, "logprobs"},
      {[](SamplingParams& p, double v) { p.logprobs = int(v); }, -2, "logprobs"},
      {[](SamplingParams& p, double v) { p.prompt_logprobs = int(v); }, 21, "prompt_logprobs"},
      {[](SamplingParams& p, double v) { p.logit_bias[int32_t(v)] = 1.0f; }, 50, "logit_bias"},
      {[](SamplingParams& p, double v) { p.logit_bias[1] = float(v); }, 101, "logit_bias"},
      {[](SamplingParams& p, double v) { p.stop_token_ids.push_back(int32_t(v)); }, 50, "stop_token_ids"},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p, c.value);
    const std::string msg = error_of({1, 2, 3}, p);
    EXPECT_TRUE(mentions(msg, c.field)) << c.field << " = " << c.value << ": '" << msg << "'";
  }
  SamplingParams p;
  p.top_k = 0;  // off, like -1
  p.temperature = 0.0;
  EXPECT_EQ(error_of({1}, p), "");
}

}  // namespace
}  // namespace moeserve::runtime
