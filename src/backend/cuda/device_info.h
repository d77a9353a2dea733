#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace moeserve::cuda {

struct DeviceInfo {
  int index;
  std::string name;
  int compute_capability;  // 90 for H100/H200, 121 for GB10
  int multiprocessors;
  size_t total_memory;
  size_t max_shared_memory_per_block;
};

// All visible CUDA devices; empty when there is no driver or no device.
std::vector<DeviceInfo> list_devices();

// Multiprocessors of the current device, cached per device (launch sizing: waves, CTAs per SM).
// Throws Error when the device cannot be queried.
int current_device_sm_count();

// Compute capability of the current device as major·10 + minor (90 for H100/H200, 121 for GB10),
// cached per device. Throws Error when the device cannot be queried.
int current_device_compute_capability();

}  // namespace moeserve::cuda
