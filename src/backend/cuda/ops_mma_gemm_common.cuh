// Device pieces shared by the mma_gemm kernels (ops_mma_gemm.cu: register-staged tilings;
// ops_mma_gemm_pipelined.cu: the cp.async-pipelined Large kernel): the weight kinds, the exact
// 16-byte weight -> bf16 conversion, the grouped grid raster and the epilogue (INT8 scale,
// accumulate, stores). Both kernels use these same functions, so the only arithmetic that could
// differ between them is the MMA sequence itself, which both issue in the order of
// ops_mma_gemm.h. Device code; include from .cu files only.
#pragma once
#include <cstdint>

#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/device_linear.h"

namespace moeserve::cuda::mma_gemm_detail {

enum class WKind { Bf16, Fp8, Int8 };

constexpr int kGroupM = 8;  // row tiles per raster group

// 16 weight bytes (k ascending) -> 16 bf16 in two uint4 (k .. k+7, k+8 .. k+15), exactly.
template <WKind kKind>
__device__ __forceinline__ void convert16(uint4 raw, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if constexpr (kKind == WKind::Fp8) {
      o[2 * q] = mma_frag::fp8x2_to_bf16x2(w[q]);
      o[2 * q + 1] = mma_frag::fp8x2_to_bf16x2(w[q] >> 16);
    } else {
      o[2 * q] = mma_frag::i8x2_to_bf16x2(w[q]);
      o[2 * q + 1] = mma_frag::i8x2_to_bf16x2(w[q] >> 16);
    }
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// Grouped raster of a 1-D grid: kGroupM row tiles x all column tiles, row tile fastest inside a
// group, so the CTAs resident together share their X and W tiles through L2.
__device__ __forceinline__ void raster(int pid, int M, int N, int BM, int BN, int& m0, int& n0) {
  const int mt = (M + BM - 1) / BM, nt = (N + BN - 1) / BN;
  const int per_group = kGroupM * nt;
  const int first_m = (pid / per_group) * kGroupM;
  const int gsize = min(mt - first_m, kGroupM);
  m0 = (first_m + (pid % per_group) % gsize) * BM;
  n0 = ((pid % per_group) / gsize) * BN;
}

// Epilogue of one warp: its MI x NI m16n8 fragments start at output (row0, col0). Fragment
// element e of (mi, ni) is row g (+8 for e >= 2), column 2t + (e & 1) (g = lane/4, t = lane%4).
// v = acc (FP8) or c; INT8: v = v ⊗ scale[n]; accumulate: y = y_old ⊕ v.
template <WKind kKind, int MI, int NI>
__device__ __forceinline__ void store_fragments(const float (&c)[MI][NI][4], const float (&acc)[MI][NI][4], int row0,
                                                int col0, int lane, int M, int N, const float* __restrict__ scale,
                                                float* __restrict__ y, bool accumulate) {
  const bool vec2 = (N & 1) == 0 && (reinterpret_cast<uintptr_t>(y) & 7) == 0;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row0 + mi * 16 + (lane >> 2) + h * 8;
        const int n = col0 + ni * 8 + (lane & 3) * 2;
        if (m >= M || n >= N) continue;
        const bool two = n + 1 < N;
        float v0 = kKind == WKind::Fp8 ? acc[mi][ni][2 * h] : c[mi][ni][2 * h];
        float v1 = kKind == WKind::Fp8 ? acc[mi][ni][2 * h + 1] : c[mi][ni][2 * h + 1];
        if constexpr (kKind == WKind::Int8) {
          v0 = __fmul_rn(v0, __ldg(scale + n));
          if (two) v1 = __fmul_rn(v1, __ldg(scale + n + 1));
        }
        float* p = y + size_t(m) * N + n;
        if (two && vec2) {
          float2 o = make_float2(v0, v1);
          if (accumulate) {
            const float2 old = *reinterpret_cast<const float2*>(p);
            o = make_float2(__fadd_rn(old.x, v0), __fadd_rn(old.y, v1));
          }
          *reinterpret_cast<float2*>(p) = o;
        } else {
          p[0] = accumulate ? __fadd_rn(p[0], v0) : v0;
          if (two) p[1] = accumulate ? __fadd_rn(p[1], v1) : v1;
        }
      }
}

// FP8: acc = fma(C, s, acc) and C = 0 for every fragment element (the 128-k block flush).
template <int MI, int NI>
__device__ __forceinline__ void flush_fp8_block(float (&c)[MI][NI][4], float (&acc)[MI][NI][4], float s) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[mi][ni][e] = __fmaf_rn(c[mi][ni][e], s, acc[mi][ni][e]);
        c[mi][ni][e] = 0.f;
      }
}

}  // namespace moeserve::cuda::mma_gemm_detail

namespace moeserve::cuda {
// The pipelined Large kernel (ops_mma_gemm_pipelined.cu), launched by mma_gemm (ops_mma_gemm.cu).
void mma_gemm_pipelined_launch(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate,
                               cudaStream_t stream);
void mma_gemm_pipelined_prepare();
}  // namespace moeserve::cuda
