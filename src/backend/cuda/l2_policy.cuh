// L2 eviction policies for the loads that stream weights (device code; include from .cu files only).
//
// A batch-1 decode step reads ~7.3 GB of weights through a 50 MB L2 once each: at ~2 TB/s the L2
// turns over every ~25 us, so under the default (evict_normal) policy the weights push out what
// the latency-bound kernels re-read a layer or a step later: their code, the activations, counters
// and partials. Loads under the evict_first policy mark their lines to go first, so the other lines
// stay (weight_l2_policy.h: the process-wide switch, read at launch time into the kernels'
// arguments). The policy changes where lines live in L2, never the values loaded.
#pragma once
#include <cstdint>

namespace moeserve::cuda {

// createpolicy is pure (no inputs, no side effects): not volatile, so the compiler hoists and
// shares it; the 64-bit value is an operand of the loads (.L2::cache_hint).
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}
__device__ __forceinline__ uint64_t l2_policy_evict_normal() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}
// The weight streams' policy from a launch argument (WeightL2Policy as int: 1 evict_first).
__device__ __forceinline__ uint64_t weight_l2_policy(int evict_first) {
  return evict_first ? l2_policy_evict_first() : l2_policy_evict_normal();
}

}  // namespace moeserve::cuda
