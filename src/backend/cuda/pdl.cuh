// Programmatic dependent launch (PDL, sm_90+; the H200 and the DGX Spark both have it).
//
// In a chain of small kernels on one stream (a decode step: ~10 per layer), each kernel
// normally starts only after the previous one has finished and its launch has gone through
// the front end: ~1 us per boundary inside a CUDA graph. With PDL the next kernel is launched
// while the current one runs; its CTAs start as soon as the current kernel's CTAs have all
// executed pdl_launch_dependents() (or exited) and there is room on the SMs, and they wait in
// pdl_wait() until the previous grid has completed and its memory is visible. So:
//
//   __global__ void k(...) {
//     pdl_launch_dependents();  // let the next kernel's CTAs get resident early
//     pdl_wait();               // BEFORE any global read or write another kernel may touch
//     ...
//   }
//   launch_pdl(k, grid, block, smem, stream, args...);
//
// Rules. Every kernel launched with launch_pdl must call pdl_wait() before touching global
// memory that earlier kernels write or read (read-after-write AND write-after-read). Waiting
// for the previous grid is transitive: that grid itself completed only after its own wait, so
// a kernel sees every earlier kernel's writes. pdl_wait() and pdl_launch_dependents() are
// no-ops in a kernel launched without the attribute, so kernels may always contain them.
// Early-resident CTAs of the next kernel take SM slots: use PDL for launches of at most about
// one wave (decode steps), not for multi-wave prefill kernels (launch_pdl's `enable`).
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.h"

namespace moeserve::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) with the first n of attrs.
template <typename Kernel, typename... Args>
void launch_with_attributes(cudaLaunchAttribute* attrs, unsigned n, Kernel kernel, dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  MOESERVE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

inline cudaLaunchAttribute programmatic_serialization() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-serialization
// attribute when PDL is enabled and `enable` (callers pass false for multi-wave launches).
template <typename Kernel, typename... Args>
void launch_pdl(bool enable, Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args... args) {
  cudaLaunchAttribute attr[1] = {programmatic_serialization()};
  launch_with_attributes(attr, enable && pdl_enabled() ? 1 : 0, kernel, grid, block, smem, stream, args...);
}

// launch_pdl for a grid whose CTAs wait for each other (a grid-wide barrier): also a cooperative
// launch, so the runtime guarantees every CTA resident at once (or fails the launch) whatever else
// shares the device (other streams, MPS limits). Needs cudaDevAttrCooperativeLaunch.
template <typename Kernel, typename... Args>
void launch_pdl_cooperative(bool enable, Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            Args... args) {
  cudaLaunchAttribute attr[2];
  attr[0] = cudaLaunchAttribute{};
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1] = programmatic_serialization();
  launch_with_attributes(attr, enable && pdl_enabled() ? 2 : 1, kernel, grid, block, smem, stream, args...);
}

}  // namespace moeserve::cuda
