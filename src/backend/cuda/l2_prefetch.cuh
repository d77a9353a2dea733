// The L2 prefetch hint the kernels share (device code; include from .cu files only).
#pragma once

namespace moeserve::cuda {

// Brings the line holding p into L2. No register is written and no fault is raised on the data
// path; safe before griddepcontrol.wait even for data an earlier kernel is still writing (L2 is the
// point of coherence; nothing reaches registers).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

}  // namespace moeserve::cuda
