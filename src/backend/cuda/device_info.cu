// CUDA device discovery. Kept free of spdlog/fmt (they do not compile under nvcc C++20).
#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"

namespace moeserve::cuda {

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.major * 10 + p.minor, p.multiProcessorCount,
                   size_t(p.totalGlobalMem), size_t(p.sharedMemPerBlockOptin)});
  }
  return out;
}

namespace {

// query(dev) of the current device, cached per device in `cache` (devices 64 and up: queried
// every time). query's result must be positive.
template <class Query>
int cached_per_device(std::atomic<int> (&cache)[64], Query query) {
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64) {
    const int n = cache[dev].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  const int n = query(dev);
  if (dev >= 0 && dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace

int current_device_sm_count() {
  static std::atomic<int> cache[64];
  return cached_per_device(cache, [](int dev) {
    int n = 0;
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n > 0 ? n : 1;
  });
}

int current_device_compute_capability() {
  static std::atomic<int> cache[64];
  return cached_per_device(cache, [](int dev) {
    int major = 0, minor = 0;
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major * 10 + minor > 0 ? major * 10 + minor : 1;
  });
}

SmLimits device_sm_limits(int dev) {
  SmLimits l;
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev));
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&l.regs_per_sm, cudaDevAttrMaxRegistersPerMultiprocessor, dev));
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&l.threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, dev));
  return l;
}

KernelResources opt_in_max_shared(const void* kernel, int smem_optin) {
  cudaFuncAttributes fa{};
  MOESERVE_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  MOESERVE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin - int(fa.sharedSizeBytes)));
  // All of the unified L1 / shared memory as shared memory, so the planned CTAs per SM fit.
  MOESERVE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)));
  return {fa.numRegs, int(fa.sharedSizeBytes)};
}

}  // namespace moeserve::cuda
