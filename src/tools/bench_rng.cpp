#include "tools/bench_rng.h"

#include <cmath>
#include <numbers>

namespace moeserve::tools {

uint64_t Rng::below(uint64_t n) {
  // Rejection of the top partial range keeps every value equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return x % n;
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_normal_;
  }
  double u1;
  do u1 = uniform();
  while (u1 <= 0.0);
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  spare_normal_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

double Rng::gamma(double shape) {
  // Marsaglia and Tsang (2000); shape < 1 uses Gamma(shape+1) * U^(1/shape).
  if (shape < 1.0) {
    double u;
    do u = uniform();
    while (u <= 0.0);
    return gamma(shape + 1.0) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = uniform();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (u > 0.0 && std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

uint64_t fnv1a64(const char* data, uint64_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = 0; i < size; ++i) {
    h ^= uint8_t(data[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace moeserve::tools
