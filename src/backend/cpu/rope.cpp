#include "backend/cpu/rope.h"

#include <cmath>

#include "core/error.h"

namespace moeserve::cpu {

RotaryEmbedding::RotaryEmbedding(int64_t rotary_dim, double theta) : rotary_dim_(rotary_dim) {
  MOESERVE_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary dimension must be even and positive, got {}",
                 rotary_dim);
  MOESERVE_CHECK(theta > 0, "rope_theta must be positive, got {}", theta);
  const int64_t half = rotary_dim / 2;
  inv_freq_.resize(size_t(half));
  for (int64_t j = 0; j < half; ++j) {
    // torch: 1.0 / (theta ** (arange(0, dim, 2).float() / dim)), all in fp32.
    const float exponent = float(2 * j) / float(rotary_dim);
    inv_freq_[size_t(j)] = 1.0f / std::pow(float(theta), exponent);
  }
}

void RotaryEmbedding::apply(float* head, int64_t pos) const {
  const int64_t half = rotary_dim_ / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float f = float(pos) * inv_freq_[size_t(j)];  // fp32 product, as torch's matmul
    const float c = std::cos(f), s = std::sin(f);
    const float x1 = head[j], x2 = head[j + half];
    head[j] = x1 * c - x2 * s;
    head[j + half] = x2 * c + x1 * s;
  }
}

}  // namespace moeserve::cpu
