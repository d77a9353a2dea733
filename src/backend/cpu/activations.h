// Scalar activations of the Qwen3.5 forward pass, in fp32 (../shared/spec/qwen35_arch.md
// sections 2.3-2.7). They follow torch's definitions so that values match the reference.
#pragma once
#include <cmath>

namespace moeserve::cpu {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// x * sigmoid(x), as torch.nn.functional.silu.
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus with beta 1 and threshold 20: the identity above 20,
// log1p(exp(x)) below (section 2.5 step 4).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace moeserve::cpu
