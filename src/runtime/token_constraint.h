// A per-sequence rule for which tokens may come next: structured output (response_format
// json_object / json_schema; src/structured). The runtime only sees this interface: the
// sampler asks it to mask the logits before choosing (sampler.h, step 2), and the step
// executor tells it which token was chosen. A sequence with a constraint is always sampled on
// the host (the model returns its logits row).
#pragma once
#include <cstdint>
#include <memory>
#include <span>

namespace moeserve::runtime {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logits of the tokens that may not come next to -inf. `end_tokens` are the ids
  // that end the sequence (its eos and stop token ids): they stay allowed only where the
  // constraint is satisfied, e.g. once the JSON value is complete.
  virtual void mask_logits(std::span<float> logits, std::span<const int32_t> end_tokens) = 0;
  // Advances past `token`, which the last mask allowed. Throws moeserve::Error naming the
  // token when it is not allowed (the sequence then fails instead of breaking its format).
  virtual void accept(int32_t token, std::span<const int32_t> end_tokens) = 0;
};

// Shared by the sequences of one request (SamplingParams::constraint): makes each its own
// constraint, in its initial state.
class TokenConstraintFactory {
 public:
  virtual ~TokenConstraintFactory() = default;
  virtual std::unique_ptr<TokenConstraint> start() const = 0;
};

}  // namespace moeserve::runtime
