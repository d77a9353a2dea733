// Device math shared by the Gated DeltaNet kernels (ops_gdn.cu: prep, recurrence, one-launch
// decode; ops_gdn_chunked.cu: the chunked prompt form). Every step is an explicit
// round-to-nearest intrinsic, so a value has the same bits in every kernel that computes it
// (spec 2.5 items 4 and 6; the sums' orders are fixed by the caller's block shape).
#pragma once
#include <cuda_runtime.h>

namespace moeserve::cuda::gdn_math {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

// Xor butterfly over the warp: every lane gets the sum, in an order fixed by the lane count.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sums one value per (thread, token) over the CTA for each of TT tokens: xor butterfly in each
// warp, then the warps' sums in warp order (an order fixed by the block size, which depends on
// the shape only). red: [nwarps][TT] floats. Every thread gets the sums.
// Contains barriers: call from all threads.
template <int TT>
__device__ __forceinline__ void block_sums(float (&v)[TT], float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int t = 0; t < TT; ++t) v[t] = warp_sum(v[t]);
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < TT; ++t) red[warp * TT + t] = v[t];
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < TT; ++t) {
    float sum = red[t];
    for (int ww = 1; ww < nwarps; ++ww) sum = __fadd_rn(sum, red[ww * TT + t]);
    v[t] = sum;
  }
  __syncthreads();  // red is reused by the next call
}

// beta = sigmoid(b).
__device__ __forceinline__ float gdn_beta(float b) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b))); }

// The log decay g = −exp(A_log)·softplus(a + dt_bias), softplus with torch's threshold 20.
__device__ __forceinline__ float gdn_log_decay(float a, float dt_bias, float a_log) {
  const float x = __fadd_rn(a, dt_bias);
  const float softplus = x > 20.0f ? x : log1pf(expf(x));
  return __fmul_rn(-expf(a_log), softplus);
}

// l2norm factors, with HF's fixed eps of 1e-6: q̂ = q · (1/sqrt(Σq² + eps)) · (1/sqrt(dk)),
// k̂ = k · (1/sqrt(Σk² + eps)).
__device__ __forceinline__ float l2norm_q(float q, float qq, int dk) {
  const float q_scale = __fdiv_rn(1.0f, __fsqrt_rn(float(dk)));
  return __fmul_rn(__fmul_rn(q, __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(qq, 1e-6f)))), q_scale);
}
__device__ __forceinline__ float l2norm_k(float k, float kk) {
  return __fmul_rn(k, __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(kk, 1e-6f))));
}

}  // namespace moeserve::cuda::gdn_math
