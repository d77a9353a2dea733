// DeviceBuffer: an owning, move-only cudaMalloc allocation of n elements of T.
// Allocation happens at load or cache-allocation time only, never inside a step.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace moeserve::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }

  // Frees the old allocation (contents lost) and allocates n elements.
  void resize(size_t n) {
    release();
    if (n == 0) return;
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, n * sizeof(T));
    if (err != cudaSuccess) {
      cudaGetLastError();
      // Only a failed allocation is "out of memory"; no device or driver fails here too.
      throw Error(std::string(err == cudaErrorMemoryAllocation ? "out of GPU memory: " : "") +
                  "cannot allocate " + std::to_string(n * sizeof(T)) + " bytes on the GPU (" +
                  cudaGetErrorString(err) + ")");
    }
    ptr_ = static_cast<T*>(p);
    n_ = n;
  }
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = 0;
  }

  T* data() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void upload(const T* host, size_t n, cudaStream_t stream = nullptr, size_t offset = 0) {
    if (offset + n > n_) throw Error("DeviceBuffer::upload out of range");
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(ptr_ + offset, host, n * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  void upload(const std::vector<T>& host, cudaStream_t stream = nullptr) {
    if (n_ != host.size()) resize(host.size());
    upload(host.data(), host.size(), stream);
  }
  std::vector<T> download(cudaStream_t stream = nullptr) const {
    std::vector<T> out(n_);
    if (n_) {
      MOESERVE_CUDA_CHECK(cudaMemcpyAsync(out.data(), ptr_, bytes(), cudaMemcpyDeviceToHost, stream));
      MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    return out;
  }
  void zero(cudaStream_t stream = nullptr) {
    if (n_) MOESERVE_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes(), stream));
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

}  // namespace moeserve::cuda
