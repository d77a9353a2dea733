// Random weights created directly on the GPU (--load-format dummy): full-size benchmarks of
// any config without a checkpoint. Deterministic for a seed (a counter-based hash per element).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeserve::cuda {

// Uniform in [-scale, scale).
void fill_uniform_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float scale, cudaStream_t stream);
void fill_uniform_f32(float* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);
void fill_uniform_f16(__half* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);
// Random 32-bit words (packed INT4 nibbles).
void fill_random_words(int32_t* p, size_t n, uint64_t seed, cudaStream_t stream);
void fill_constant_words(int32_t* p, size_t n, int32_t value, cudaStream_t stream);
// e4m3 bytes of uniform values in [-scale, scale) (never NaN).
void fill_uniform_fp8(uint8_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream);
void fill_uniform_int8(int8_t* p, size_t n, uint64_t seed, cudaStream_t stream);

}  // namespace moeserve::cuda
