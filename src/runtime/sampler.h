// Turns one sequence's logits into its next token, with vLLM's order of operations:
//   1. logprobs, when asked, of the model's raw distribution (log-softmax of the raw logits);
//   2. min_tokens: eos and stop tokens masked while fewer than min_tokens were generated;
//      a structured-output constraint masks the tokens that would break its format;
//   3. logit_bias added;
//   4. penalties: repetition (prompt + output), frequency and presence (output);
//   5. greedy (temperature ~ 0): argmax, lowest id on ties; otherwise
//   6. divide by temperature, min_p, top_k, top_p (over what top_k kept), and draw from the
//      renormalised rest with the request's own RNG (one uniform per sampled token).
//
// Step 6 in fp32, exactly as the device kernels do it (src/backend/cuda/ops_sampling.h), so
// that both make the same decisions from the same bits: scaled = logit * float(1 / T);
// candidates are the tokens with scaled - max >= float(log(min_p)) (and >= -87: weights stay
// normal floats), weighted by expf(scaled - max); top_k and top_p rank them by scaled logit,
// highest first, lower id on ties (top_k keeps ties of the k-th scaled logit); the draw walks
// what they kept in id order (any fixed order gives the same distribution; this one needs no
// sort). Only sums of weights (top_p's cut, the draw) depend on rounding, at the 1e-7 level.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/causal_lm.h"
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
  TokenConstraint* constraint = nullptr;  // the sequence's structured-output state, if any
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

  // The device-sampling contract (model::DeviceSampleParams) on the CPU: what a model that
  // samples on its device must return for raw `logits`. Throws like sample() when no token
  // is left to choose.
  SampleResult sample_row(std::span<const float> logits, const model::DeviceSampleParams& params);

 private:
  static bool needs_processing(const SampleInput& input);
  // Step 6 over work_ (the processed logits); the uniform comes from `rng` when given (drawn
  // once the candidates are known), else it is `uniform`.
  int32_t sample_random(const model::DeviceSampleParams& params, Rng* rng);
  int32_t argmax_of_work() const;

  std::vector<float> work_;     // processed, then scaled logits
  std::vector<float> weights_;  // expf(scaled - max) of the candidates
  std::vector<int32_t> candidates_;  // in id order
  std::vector<int32_t> ranked_;      // a copy that top_k / top_p reorder
};

// float(1.0 / temperature) and min_p as a log-ratio threshold, as both sampling paths use them.
float inverse_temperature(double temperature);
float min_p_log_ratio(double min_p);

// The ids that end `input`'s sequence: its stop token ids, and the eos ids unless ignore_eos.
std::vector<int32_t> end_tokens(const SampleInput& input);

// The device-sampling form of `input` (its logits are not read), or nullopt when the request
// needs the host path: penalties, logit_bias or a structured-output constraint, more than
// model::kMaxDeviceLogprobs logprobs, more than model::kMaxDeviceMaskedTokens tokens held
// back by min_tokens. A sampled (not
// greedy) request draws its uniform from input.rng here, the one draw sample() would make,
// so the RNG stream and the tokens of a seeded request are the same on both paths.
// `masked` stores the ids the params point to; it must outlive them.
std::optional<model::DeviceSampleParams> to_device_sample(const SampleInput& input, int64_t vocab,
                                                          std::vector<int32_t>& masked);

// The top-p cut: reorders `candidates` so that its first k entries are the most likely
// (by key, lower id first on ties) and returns the smallest k whose weights sum to at
// least `target`. Expected O(n): no sort of the whole vocabulary.
size_t top_p_cut(std::vector<int32_t>& candidates, const float* keys, const float* weights, double target);
// The same with the weights as keys.
size_t top_p_cut(std::vector<int32_t>& candidates, const float* weights, double target);

// log-softmax of `logits` at `token`, with the `top_k` most likely tokens (highest first,
// lowest id on ties). NaN logits count as -inf.
TokenLogprob compute_logprobs(std::span<const float> logits, int32_t token, int top_k);

}  // namespace moeserve::runtime
