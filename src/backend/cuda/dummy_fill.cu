#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dummy_fill.h"

namespace moeserve::cuda {
namespace {

// splitmix64 of (seed, index): independent, reproducible values per element.
__device__ __forceinline__ uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float unit(uint64_t seed, uint64_t i) {  // [0, 1)
  return float(mix(seed, i) >> 40) * (1.0f / 16777216.0f);
}

template <typename F>
__global__ void fill_kernel(size_t n, F f) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) f(i);
}

template <typename F>
void launch(size_t n, cudaStream_t stream, F f) {
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, 65536));
  fill_kernel<<<blocks, 256, 0, stream>>>(n, f);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fill_uniform_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  launch(n, stream, [=] __device__(size_t i) { p[i] = __float2bfloat16((2.0f * unit(seed, i) - 1.0f) * scale); });
}
void fill_uniform_f32(float* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  launch(n, stream, [=] __device__(size_t i) { p[i] = lo + (hi - lo) * unit(seed, i); });
}
void fill_uniform_f16(__half* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  launch(n, stream, [=] __device__(size_t i) { p[i] = __float2half(lo + (hi - lo) * unit(seed, i)); });
}
void fill_random_words(int32_t* p, size_t n, uint64_t seed, cudaStream_t stream) {
  launch(n, stream, [=] __device__(size_t i) { p[i] = int32_t(uint32_t(mix(seed, i))); });
}
void fill_constant_words(int32_t* p, size_t n, int32_t value, cudaStream_t stream) {
  launch(n, stream, [=] __device__(size_t i) { p[i] = value; });
}
void fill_uniform_fp8(uint8_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  launch(n, stream, [=] __device__(size_t i) {
    __nv_fp8_e4m3 v((2.0f * unit(seed, i) - 1.0f) * scale);
    p[i] = v.__x;
  });
}
void fill_uniform_int8(int8_t* p, size_t n, uint64_t seed, cudaStream_t stream) {
  launch(n, stream, [=] __device__(size_t i) { p[i] = int8_t(int(unit(seed, i) * 255.0f) - 127); });
}

}  // namespace moeserve::cuda
