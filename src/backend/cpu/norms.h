// The three normalisations of Qwen3.5 (../shared/spec/qwen35_arch.md section 2.1), fp32.
#pragma once
#include <cstdint>

#include "core/thread_pool.h"

namespace moeserve::cpu {

// Zero-centred RMSNorm (section 2.1.1): y = x · rsqrt(mean(x²) + eps) · (1 + w).
// Used for the layer norms, the final norm, q_norm/k_norm and the MTP norms.
void rms_norm_zero_centred(const float* x, float* y, int64_t n, const float* w, float eps);

// The same over `rows` rows of n values (x and y may alias), threaded over rows.
void rms_norm_zero_centred_rows(ThreadPool& pool, const float* x, float* y, int64_t rows, int64_t n,
                                const float* w, float eps);

// Gated RMSNorm of a GDN value head (section 2.1.2): plain w, not (1 + w).
// y = w · (x · rsqrt(mean(x²) + eps)) · silu(z). x and y may alias.
void rms_norm_gated(const float* x, const float* z, float* y, int64_t n, const float* w, float eps);

// L2 normalisation in place (section 2.1.3): x ← x · rsqrt(Σx² + eps).
void l2_normalize(float* x, int64_t n, float eps);

}  // namespace moeserve::cpu
