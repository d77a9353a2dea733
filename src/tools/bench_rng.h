// A small deterministic random generator (runtime::Rng: SplitMix64 seeding xoshiro256**) with the
// few distributions the tools need. The standard library's distributions are implementation-
// defined, so they would break "same seed, same bytes" across platforms; these are ours.
// Used by the benchmark (random prompts, arrival times) and the demo-model generator.
#pragma once
#include <cstdint>

#include "runtime/rng.h"

namespace moeserve::tools {

class Rng {
 public:
  explicit Rng(uint64_t seed) : core_(seed) {}
  uint64_t next_u64() { return core_.next_u64(); }
  double uniform() { return core_.uniform(); }  // [0, 1), 53 random bits
  uint64_t below(uint64_t n);  // [0, n), unbiased; n > 0
  double normal();             // standard normal (Box-Muller, both values used)
  double gamma(double shape);  // Gamma(shape, scale 1), shape > 0 (Marsaglia-Tsang)

 private:
  runtime::Rng core_;
  double spare_normal_ = 0;
  bool has_spare_ = false;
};

// FNV-1a 64-bit hash of a string: derives independent per-name seeds.
uint64_t fnv1a64(const char* data, uint64_t size);

}  // namespace moeserve::tools
