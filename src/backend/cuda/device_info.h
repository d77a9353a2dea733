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

// The per-SM and per-block limits the decode kernels' launch plans read (the streaming expert
// kernels: shared memory, registers and threads per SM), of device dev, uncached (callers keep
// their own per-device plan inputs). Throws Error when the device cannot be queried.
struct SmLimits {
  int sms = 0, smem_per_sm = 0, smem_optin = 0, smem_reserved = 0, regs_per_sm = 0, threads_per_sm = 0;
};
SmLimits device_sm_limits(int dev);

// Opts a kernel (its address) in to the largest dynamic shared memory a block may have on the
// current device (smem_optin minus its static shared memory) and to the largest shared-memory
// carveout, and returns its registers per thread and static shared memory. Not a stream
// operation: legal inside CUDA-graph capture.
struct KernelResources {
  int regs = 0, static_smem = 0;
};
KernelResources opt_in_max_shared(const void* kernel, int smem_optin);

}  // namespace moeserve::cuda
