// The (1 + w) RMSNorm of one row (spec 2.1.1) as add_rms_norm computes it, in device functions
// shared by add_rms_norm's kernels (ops_basic.cu) and the row GEMVs' norm prologue
// (ops_quant_gemv_multi.cu: rms_norm_fill), so that both give the same bits.
//
// Layout: a row of H f32 (16-byte aligned, H % 4 == 0 on the vector paths), cut into chunks of 4
// (chunk c = elements 4c .. 4c+3). add_rms_norm runs T = rms_norm_plan(H).threads threads on a row,
// thread t owning chunks t, t + T, ... (per_thread of them; chunks past the row read as zero).
// Arithmetic, every step an explicit round-to-nearest operation:
//   v      = residual (+ delta) (then fmaf(sigmoid(gate), values, v) for a gated add)
//   Σ      = thread t's chunks in order, x..w within a chunk, one fma each; an xor tree
//            (16, 8, 4, 2, 1) per warp; the T / 32 warp totals (lane i: warp i's, +0 past them) by
//            the same tree; lane 0's value
//   inv    = rsqrt(Σ / H + eps)
//   y      = (v · inv) · (1 + w)
// So a row's bits depend on H alone (not on M, the other rows, or the CTA that computes them):
// rms_norm_fill reproduces T's tree with any multiple of 32 threads (its warps take T's warps in
// turn).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/async_copy.cuh"

namespace moeserve::cuda::rms_row {

struct NormPlan {
  int threads;     // T: a multiple of 32, at most 1024
  int per_thread;  // chunks per thread
};

__host__ __device__ constexpr NormPlan rms_norm_plan(int H) {
  const int chunks = (H + 3) / 4;
  const int threads = (chunks + 31) / 32 * 32 < 1024 ? (chunks + 31) / 32 * 32 : 1024;
  return {threads, (chunks + threads - 1) / threads};
}

__device__ __forceinline__ float sum_squares(float ss, float4 v) {
  ss = __fmaf_rn(v.x, v.x, ss);
  ss = __fmaf_rn(v.y, v.y, ss);
  ss = __fmaf_rn(v.z, v.z, ss);
  return __fmaf_rn(v.w, v.w, ss);
}

// The xor tree over a warp (every lane holds a sum; lane 0's is the one used).
__device__ __forceinline__ float warp_tree(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float rms_inv(float total, int H, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(total, float(H)), eps));
}

__device__ __forceinline__ float4 norm_chunk(float4 v, float inv, float4 w) {
  return make_float4(__fmul_rn(__fmul_rn(v.x, inv), __fadd_rn(1.0f, w.x)),
                     __fmul_rn(__fmul_rn(v.y, inv), __fadd_rn(1.0f, w.y)),
                     __fmul_rn(__fmul_rn(v.z, inv), __fadd_rn(1.0f, w.z)),
                     __fmul_rn(__fmul_rn(v.w, inv), __fadd_rn(1.0f, w.w)));
}

// The gated add (ops_basic.h GatedAdd): sigmoid of the row's gate logit exactly as the MoE combine
// computes the shared expert's scale, then one fma per element.
__device__ __forceinline__ float gated_scale(float logit) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, __expf(-logit))); }
__device__ __forceinline__ float4 gated_add(float4 v, float s, float4 g) {
  return make_float4(__fmaf_rn(s, g.x, v.x), __fmaf_rn(s, g.y, v.y), __fmaf_rn(s, g.z, v.z), __fmaf_rn(s, g.w, v.w));
}

// The norm input of a row GEMV (ops_quant_gemv.h RowNormInput, as a kernel parameter).
struct NormArgs {
  const float* residual;    // [M, K]
  const float* values;      // [M, K] gated add (null: none)
  const float* gate_logit;  // [M]
  const float* weight;      // [K]: the norm's w (applied as 1 + w)
  float eps;
  float* residual_out;  // [M, K] or null: v (the updated residual), by the writer CTA
  float* x_out;         // [M, K] or null: y (add_rms_norm's out_f32), by the writer CTA
};

// act[m, :] = y of row m0 + m for the tile's mt (<= MT) rows, all of K, in shared memory, by a CTA of kN
// threads (a multiple of 32); the writer CTA also stores v and y where asked. act holds MT·K floats, and
// MT·K more after them with a gated add (the values' copy). K % 4 == 0, every pointer 16-byte aligned,
// rms_norm_plan(K).threads <= 32·32. The rows (and values) come in one round trip by cp.async through
// L2 (another kernel wrote them), so no register holds them in flight: the caller's weight loads in
// registers stay where they are. Every thread of the CTA must call it: three barriers, the last one at
// the end.
template <int kN, int MT>
__device__ __forceinline__ void rms_norm_fill(const NormArgs& n, int K, int m0, int mt, float* act, bool writer) {
  __shared__ float s_warp_sums[MT][32];
  const NormPlan p = rms_norm_plan(K);
  const int q = K / 4, nvw = p.threads / 32, tid = int(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  float4* a4 = reinterpret_cast<float4*>(act);
  float4* g4 = a4 + size_t(MT) * q;  // the values' copy (gated add only)
  const float4* w4 = reinterpret_cast<const float4*>(n.weight);
  // 1. The rows (and values) into shared memory; the weight's chunks of step 3 into L1 (it is never
  //    written, so L1 may hold it).
  const size_t base = size_t(m0) * size_t(q);
  for (int e = tid; e < mt * q; e += kN) {
    async_copy::cp_async16(a4 + e, reinterpret_cast<const float4*>(n.residual) + base + e);
    if (n.values) async_copy::cp_async16(g4 + e, reinterpret_cast<const float4*>(n.values) + base + e);
  }
  async_copy::cp_async_commit();
  for (int c = tid; c < q; c += kN) asm volatile("prefetch.global.L1 [%0];" ::"l"(w4 + c));
  float sg[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) sg[m] = n.values && m < mt ? gated_scale(__ldcg(n.gate_logit + m0 + m)) : 0.0f;
  async_copy::cp_async_wait<0>();
  __syncthreads();
  // 2. add_rms_norm's warp sums: CTA warp w takes its warps w, w + kN/32, ... lane for lane (each chunk
  //    belongs to one of them, which also applies the gated add to it).
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    if (m >= mt) break;
    for (int vw = warp; vw < nvw; vw += kN / 32) {
      const int t = 32 * vw + lane;
      float ss = 0.0f;
      for (int j = 0; j < p.per_thread; ++j) {
        const int c = t + j * p.threads;
        if (c < q) {
          float4 v = a4[m * q + c];
          if (n.values) {
            v = gated_add(v, sg[m], g4[m * q + c]);
            a4[m * q + c] = v;
          }
          ss = sum_squares(ss, v);
        }
      }
      ss = warp_tree(ss);
      if (lane == 0) s_warp_sums[m][vw] = ss;
    }
  }
  __syncthreads();
  // 3. y = v · inv · (1 + w) in place; the writer's copies.
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    if (m >= mt) break;
    const float total = __shfl_sync(0xffffffffu, warp_tree(lane < nvw ? s_warp_sums[m][lane] : 0.0f), 0);
    const float inv = rms_inv(total, K, n.eps);
    const size_t row = size_t(m0 + m) * size_t(q);
    for (int c = tid; c < q; c += kN) {
      const float4 v = a4[m * q + c];
      const float4 y = norm_chunk(v, inv, __ldg(w4 + c));
      a4[m * q + c] = y;
      if (writer) {
        if (n.residual_out) reinterpret_cast<float4*>(n.residual_out)[row + c] = v;
        if (n.x_out) reinterpret_cast<float4*>(n.x_out)[row + c] = y;
      }
    }
  }
  __syncthreads();
}

}  // namespace moeserve::cuda::rms_row
