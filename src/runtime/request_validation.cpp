#include "runtime/request_validation.h"

#include <cmath>

#include "core/error.h"

namespace moeserve::runtime {
namespace {

bool in_range(double x, double lo, double hi) { return std::isfinite(x) && x >= lo && x <= hi; }

}  // namespace

void validate_request(std::span<const int32_t> prompt, const SamplingParams& p, int64_t vocab_size,
                      const EngineConfig& config) {
  MOESERVE_CHECK(!prompt.empty(), "the prompt is empty: at least one token is needed");
  for (size_t i = 0; i < prompt.size(); ++i) {
    MOESERVE_CHECK(prompt[i] >= 0 && prompt[i] < vocab_size,
                   "prompt token {} has id {}, outside the vocabulary [0, {})", i, prompt[i], vocab_size);
  }
  MOESERVE_CHECK(p.max_tokens >= 1, "max_tokens must be at least 1, got {}", p.max_tokens);
  const int64_t total = int64_t(prompt.size()) + p.max_tokens;
  MOESERVE_CHECK(total <= config.max_model_len,
                 "this model's maximum context length is {} tokens, but {} tokens were requested ({} in the "
                 "prompt, {} for the completion); shorten the prompt or lower max_tokens",
                 config.max_model_len, total, prompt.size(), p.max_tokens);
  MOESERVE_CHECK(p.min_tokens >= 0 && p.min_tokens <= p.max_tokens,
                 "min_tokens must be between 0 and max_tokens ({}), got {}", p.max_tokens, p.min_tokens);

  MOESERVE_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0,
                 "temperature must be a non-negative number, got {}", p.temperature);
  MOESERVE_CHECK(std::isfinite(p.top_p) && p.top_p > 0.0 && p.top_p <= 1.0, "top_p must be in (0, 1], got {}", p.top_p);
  MOESERVE_CHECK(p.top_k >= -1, "top_k must be -1 or 0 (off) or a positive count, got {}", p.top_k);
  MOESERVE_CHECK(in_range(p.min_p, 0.0, 1.0), "min_p must be in [0, 1], got {}", p.min_p);
  MOESERVE_CHECK(in_range(p.presence_penalty, -2.0, 2.0), "presence_penalty must be in [-2, 2], got {}",
                 p.presence_penalty);
  MOESERVE_CHECK(in_range(p.frequency_penalty, -2.0, 2.0), "frequency_penalty must be in [-2, 2], got {}",
                 p.frequency_penalty);
  MOESERVE_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0,
                 "repetition_penalty must be a positive number, got {}", p.repetition_penalty);

  for (const auto& [token, bias] : p.logit_bias) {
    MOESERVE_CHECK(token >= 0 && token < vocab_size, "logit_bias names token {}, outside the vocabulary [0, {})",
                   token, vocab_size);
    MOESERVE_CHECK(in_range(bias, -100.0, 100.0), "logit_bias for token {} must be in [-100, 100], got {}", token,
                   bias);
  }
  for (int32_t token : p.stop_token_ids) {
    MOESERVE_CHECK(token >= 0 && token < vocab_size, "stop_token_ids holds {}, outside the vocabulary [0, {})",
                   token, vocab_size);
  }
  MOESERVE_CHECK(p.logprobs >= -1 && p.logprobs <= config.max_logprobs,
                 "logprobs must be between 0 and {} (or unset), got {}", config.max_logprobs, p.logprobs);
  MOESERVE_CHECK(p.prompt_logprobs >= -1 && p.prompt_logprobs <= config.max_logprobs,
                 "prompt_logprobs must be between 0 and {} (or unset), got {}", config.max_logprobs,
                 p.prompt_logprobs);
}

}  // namespace moeserve::runtime
