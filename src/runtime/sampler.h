// Turns one sequence's logits into its next token, with vLLM's order of operations:
//   1. logprobs, when asked, of the model's raw distribution (log-softmax of the raw logits);
//   2. min_tokens: eos and stop tokens masked while fewer than min_tokens were generated;
//   3. logit_bias added;
//   4. penalties: repetition (prompt + output), frequency and presence (output);
//   5. greedy (temperature ~ 0): argmax, lowest id on ties; otherwise
//   6. divide by temperature, min_p, top_k, top_p (over what top_k kept), and draw from the
//      renormalised rest with the request's own RNG (one uniform per sampled token).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "runtime/request_output.h"
#include "runtime/rng.h"
#include "runtime/sampling_params.h"
#include "runtime/token_history.h"

namespace moeserve::runtime {

struct SampleInput {
  std::span<const float> logits;          // [vocab], raw
  const SamplingParams* params = nullptr;
  const TokenHistory* history = nullptr;  // prompt + tokens generated so far
  int num_generated = 0;                  // tokens generated before this one
  std::span<const int64_t> eos_token_ids; // the model's; ignored with params->ignore_eos
  Rng* rng = nullptr;                     // the request's; untouched when greedy
};

struct SampleResult {
  int32_t token = 0;
  std::optional<TokenLogprob> logprob;  // when params->logprobs >= 0
};

// Holds scratch buffers; one per thread.
class Sampler {
 public:
  // Throws moeserve::Error when no token is left to choose (every logit masked or NaN).
  SampleResult sample(const SampleInput& input);

  // Steps 2-4 alone: the logits that greedy takes the argmax of (valid until the next call).
  const std::vector<float>& process_logits(const SampleInput& input);

 private:
  static bool needs_processing(const SampleInput& input);
  int32_t sample_random(const SampleInput& input);

  std::vector<float> work_;
  std::vector<int32_t> candidates_;
};

// The top-p cut: reorders `candidates` so that its first k entries are the most likely
// (by weight, lower id first on ties) and returns the smallest k whose weights sum to at
// least `target`. Expected O(n): no sort of the whole vocabulary.
size_t top_p_cut(std::vector<int32_t>& candidates, const float* weights, double target);

// log-softmax of `logits` at `token`, with the `top_k` most likely tokens (highest first,
// lowest id on ties). NaN logits count as -inf.
TokenLogprob compute_logprobs(std::span<const float> logits, int32_t token, int top_k);

}  // namespace moeserve::runtime
