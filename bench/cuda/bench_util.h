// Helpers shared by the GPU benchmark programs in bench/cuda.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"

namespace moeserve::bench {

// "1,8,64" -> {1, 8, 64}.
inline std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stoi(item));
  return v;
}

// The roofline's bandwidth: (read + write) bytes over the median time of a 4 GiB
// device-to-device copy (10 runs after 2 warm-ups).
inline double measure_copy_bandwidth() {
  const size_t bytes = size_t(4) << 30;
  cuda::DeviceBuffer<uint8_t> a(bytes), b(bytes);
  MOESERVE_CUDA_CHECK(cudaMemset(a.data(), 1, bytes));
  cudaEvent_t e0, e1;
  MOESERVE_CUDA_CHECK(cudaEventCreate(&e0));
  MOESERVE_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 2; ++i) MOESERVE_CUDA_CHECK(cudaMemcpy(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    MOESERVE_CUDA_CHECK(cudaEventRecord(e0));
    MOESERVE_CUDA_CHECK(cudaMemcpy(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));
    MOESERVE_CUDA_CHECK(cudaEventRecord(e1));
    MOESERVE_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0.0f;
    MOESERVE_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return 2.0 * double(bytes) / (double(ms[ms.size() / 2]) * 1e-3);
}

// Median time (us) of `iters` launches of fn(i) on stream s, each between two CUDA events,
// after two warm-up launches (fn(0), fn(1)) and a synchronisation.
template <typename Fn>
double median_event_us(cudaStream_t s, int iters, Fn&& fn) {
  cudaEvent_t e0, e1;
  MOESERVE_CUDA_CHECK(cudaEventCreate(&e0));
  MOESERVE_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 2; ++i) fn(i);
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> us;
  for (int i = 0; i < std::max(1, iters); ++i) {
    MOESERVE_CUDA_CHECK(cudaEventRecord(e0, s));
    fn(i);
    MOESERVE_CUDA_CHECK(cudaEventRecord(e1, s));
    MOESERVE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    MOESERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(double(ms) * 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace moeserve::bench
