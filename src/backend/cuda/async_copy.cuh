// Asynchronous global -> shared copies (ops_quant_gemv_multi.cu: the token-tile kernel's x staging):
// thin wrappers over the PTX, nothing else.
//
// cp.async (sm_80+): each thread copies 16 bytes (.cg: through L2 only, L1 not allocated); the
// copies a thread issued since its last commit form one group; wait_group<N> returns when at most
// N of the thread's groups are still pending. Other threads see the bytes only after the copying
// thread's wait and a barrier (__syncwarp within a warp).
#pragma once
#include <cstdint>

namespace moeserve::cuda::async_copy {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async, 16 bytes per thread ---------------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace moeserve::cuda::async_copy
