// Per-request sampling controls, with the semantics of vLLM's SamplingParams (which the
// OpenAI-compatible server maps its request fields onto).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/token_constraint.h"

namespace moeserve::runtime {

struct SamplingParams {
  // Randomness. temperature == 0 (below 1e-5) is greedy: argmax of the processed logits.
  double temperature = 1.0;
  double top_p = 1.0;    // (0, 1]: keep the smallest set of tokens whose probability >= top_p
  int top_k = -1;        // -1 or 0: off; k >= 1: keep the k most likely tokens (and ties)
  double min_p = 0.0;    // [0, 1]: drop tokens below min_p * (probability of the most likely)
  // Seeds this request's own RNG, so its samples do not depend on what else is batched with
  // it. Unset: the engine draws a seed.
  std::optional<uint64_t> seed;

  // Penalties (vLLM semantics): repetition over prompt + output tokens (divides positive
  // logits, multiplies negative ones); presence and frequency over output tokens only
  // (logit -= presence * [count > 0] + frequency * count).
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  double repetition_penalty = 1.0;  // > 0; 1 is off
  std::map<int32_t, float> logit_bias;  // token -> added to its logit, [-100, 100]

  // Stopping. The model config's eos ids stop generation unless ignore_eos. A stop token is
  // part of the output (RequestOutput::stop_token says which one stopped it).
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int max_tokens = 16;  // >= 1
  int min_tokens = 0;   // [0, max_tokens]: eos and stop tokens are masked until reached

  // Log-probabilities of the model's raw distribution (log-softmax of the unprocessed logits).
  int logprobs = -1;         // -1: none; k >= 0: the sampled token's + the top k alternatives
  int prompt_logprobs = -1;  // -1: none; k >= 0: for every prompt token after the first

  // Structured output (response_format): each sequence gets its own constraint from this,
  // which masks the tokens that would break the format. Such sequences sample on the host.
  std::shared_ptr<const TokenConstraintFactory> constraint;

  bool greedy() const { return temperature < 1e-5; }
};

}  // namespace moeserve::runtime
