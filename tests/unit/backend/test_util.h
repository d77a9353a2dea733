// Helpers for the CPU backend tests: seeded random data and comparisons.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"
#include "quant/quant_weight.h"

namespace moeserve::cpu::testing {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline quant::QuantWeight random_weight(int64_t n, int64_t k, uint32_t seed, const std::string& name = "w") {
  return quant::dense_weight(Tensor::from_f32(random_vector(size_t(n * k), seed, 1.0f / std::sqrt(float(k))), {n, k}),
                             name);
}

// max |a - b| / max |b|
inline double rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den > 0 ? num / den : num;
}
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_diff(a, std::vector<double>(b.begin(), b.end()));
}

}  // namespace moeserve::cpu::testing
