#include "backend/cpu/norms.h"

#include <cmath>

#include "backend/cpu/activations.h"
#include "backend/cpu/linear.h"

namespace moeserve::cpu {

namespace {
float inv_rms(const float* x, int64_t n, float eps) {
  const float mean_square = dot(x, x, n) / float(n);
  return 1.0f / std::sqrt(mean_square + eps);
}
}  // namespace

void rms_norm_zero_centred(const float* x, float* y, int64_t n, const float* w, float eps) {
  const float r = inv_rms(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * r) * (1.0f + w[i]);
}

void rms_norm_zero_centred_rows(ThreadPool& pool, const float* x, float* y, int64_t rows, int64_t n,
                                const float* w, float eps) {
  pool.parallel_for(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) rms_norm_zero_centred(x + r * n, y + r * n, n, w, eps);
      },
      16);
}

void rms_norm_gated(const float* x, const float* z, float* y, int64_t n, const float* w, float eps) {
  const float r = inv_rms(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (w[i] * (x[i] * r)) * silu(z[i]);
}

void l2_normalize(float* x, int64_t n, float eps) {
  const float r = 1.0f / std::sqrt(dot(x, x, n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

}  // namespace moeserve::cpu
