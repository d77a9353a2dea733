// CUDA device discovery. Kept free of spdlog/fmt (they do not compile under nvcc C++20).
#include <cuda_runtime.h>

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

}  // namespace moeserve::cuda
