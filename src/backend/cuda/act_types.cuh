// Activation element types. The model keeps activations in f32 between ops (the decode step is
// bound by weight bytes, so f32 activations cost almost nothing and remove bf16 rounding of
// every intermediate); the kernels are templated on the activation type so the bf16 entry
// points stay available. Device-only helpers; include from .cu files.
#pragma once
#include <cuda_bf16.h>

namespace moeserve::cuda {

__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(float v) { return v; }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}

}  // namespace moeserve::cuda
