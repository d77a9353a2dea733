// Asynchronous global -> shared copies for streaming kernels (row_gemv_f32's shared-memory
// weight feeds, ops_quant_gemv_multi.cu): thin wrappers over the PTX, nothing else.
//
// cp.async (sm_80+): each thread copies 16 bytes (.cg: through L2 only, L1 not allocated); the
// copies a thread issued since its last commit form one group; wait_group<N> returns when at most
// N of the thread's groups are still pending. Other threads see the bytes only after the copying
// thread's wait and a barrier (__syncwarp within a warp).
//
// cp.async.bulk (sm_90+, also sm_120/121): ONE thread copies a contiguous block (16-byte aligned
// addresses, a multiple of 16 bytes) and the copy completes on an mbarrier in shared memory:
// the thread first announces the bytes (arrive + expect_tx), and the barrier's phase completes
// when the arrival and all announced bytes are in. Waiters name the phase by its parity: the
// n-th use of a barrier completes phase n, parity n & 1. Every byte announced must be copied,
// or the waiters hang.
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

// ---- mbarrier + 1-D bulk copies --------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
#endif
}
// Makes the barriers initialised by this thread visible to the async proxy (the bulk copies).
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Orders this thread's (and, after a barrier, its peers') earlier generic shared-memory
// accesses before its later async-proxy ones (a bulk copy refilling a slot just read).
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// One arrival that also announces `bytes` more bytes for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_addr(bar)),
      "r"(bytes)
      : "memory");
#endif
}
// Global -> shared, `bytes` (a multiple of 16; both addresses 16-byte aligned), completing on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#endif
}
// Returns when the phase of parity `parity` has completed (its bytes are then visible).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

}  // namespace moeserve::cuda::async_copy
