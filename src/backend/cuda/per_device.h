// A value computed once per CUDA device (host code): the launch plans' device limits and the
// kernels' shared-memory opt-ins of the decode expert kernels.
#pragma once
#include <cuda_runtime.h>

#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace moeserve::cuda {

// make(dev) for the current device, computed under a lock on the first call per device (0..63) and
// kept; every call site (its lambda type) has values of its own.
template <class Make>
const auto& once_per_device(Make make) {
  using T = decltype(make(0));
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static T values[kMaxDevices];
  static bool have[kMaxDevices] = {};
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) throw Error("CUDA device index out of range for a per-device value");
  std::lock_guard<std::mutex> lock(mu);
  if (!have[dev]) {
    values[dev] = make(dev);
    have[dev] = true;
  }
  return values[dev];
}

}  // namespace moeserve::cuda
