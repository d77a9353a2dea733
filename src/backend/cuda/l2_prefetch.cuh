// The L2 prefetch hint the kernels share (device code; include from .cu files only).
#pragma once
#include <cstdint>

namespace moeserve::cuda {

// Brings the line holding p into L2. No register is written and no fault is raised on the data
// path; safe before griddepcontrol.wait even for data an earlier kernel is still writing (L2 is the
// point of coherence; nothing reaches registers).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Asks the L2 to fetch [p, p + bytes) for a later reader (p and bytes multiples of 16): one
// cp.async.bulk.prefetch.L2 on sm_90+ (the copy engine walks the range), else one line prefetch per
// 128 bytes.
__device__ __forceinline__ void prefetch_l2_range(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  for (uint32_t o = 0; o < bytes; o += 128) prefetch_l2(static_cast<const char*>(p) + o);
#endif
}

}  // namespace moeserve::cuda
