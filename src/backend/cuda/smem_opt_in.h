// Once-per-device shared-memory opt-in of a kernel (host code): a kernel that launches with more
// than 48 KB of dynamic shared memory must first raise its cudaFuncAttributeMaxDynamicSharedMemorySize
// on each device it runs on. Shared by the prompt-token kernels (mma_gemm, moe_mma, attention prefill).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_check.h"

namespace moeserve::cuda {

// Raises kKernel's dynamic shared-memory limit to smem_bytes (and with max_carveout asks for the
// largest shared-memory carve-out, so that several such CTAs fit an SM) the first time it is
// called for kKernel on the current device (devices 64 and up: every time).
template <auto kKernel>
void opt_in_dynamic_smem(size_t smem_bytes, bool max_carveout = false) {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (done.load() & bit)) return;
  MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
  if (max_carveout)
    MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             int(cudaSharedmemCarveoutMaxShared)));
  done.fetch_or(bit);
}

}  // namespace moeserve::cuda
