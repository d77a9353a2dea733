// Bulk asynchronous copies (cp.async.bulk, sm_90+) into shared memory with mbarrier completion, for
// the wgmma kernels' operand stages (ops_tc_gemv_wgmma.cu). Device code; include from .cu files only.
// Everything compiles to nothing below sm_90 (callers keep these paths to sm_90a code).
//
// Protocol (PTX ISA, "mbarrier" and "cp.async.bulk"): one thread arms a stage's barrier with the
// bytes it expects (arrive_expect_tx) and issues the copies that complete them; consumers wait for
// the barrier's phase (wait_parity: phase k of a barrier has parity k & 1); a barrier is reused for
// the stage's next fill once every consumer is done with the stage (the caller's protocol).
#pragma once
#include <cstdint>

namespace moeserve::cuda::bulk {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#else
  (void)bar, (void)count;
#endif
}
// Makes initialised barriers visible to the async proxy (before the CTA barrier that publishes them).
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#else
  (void)bar, (void)bytes;
#endif
}
// bytes (a multiple of 16; both addresses 16-byte aligned) from global src to shared dst, completing
// on bar.
__device__ __forceinline__ void copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#else
  (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}
// Spins until the phase of parity `parity` of bar has completed.
__device__ __forceinline__ void wait_parity(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#else
  (void)bar, (void)parity;
#endif
}
// Orders this thread's earlier shared-memory accesses before later async-proxy ones (a stage's
// refill after its generic reads).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Named barrier kId (1..15) over kThreads threads (a multiple of 32); immediate operands, so ptxas
// reserves only the barriers used.
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

}  // namespace moeserve::cuda::bulk
