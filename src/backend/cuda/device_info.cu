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

int current_device_sm_count() {
  constexpr int kCached = 64;
  static std::atomic<int> cache[kCached];
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < kCached) {
    const int n = cache[dev].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int n = 0;
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  n = n > 0 ? n : 1;
  if (dev >= 0 && dev < kCached) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace moeserve::cuda
