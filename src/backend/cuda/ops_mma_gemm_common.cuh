// Device pieces shared by the mma_gemm kernels (ops_mma_gemm.cu: register-staged tilings;
// ops_mma_gemm_pipelined.cu: the cp.async-pipelined 128x128 and 128x256 kernels): the weight
// kinds, the exact 16-byte weight -> bf16 conversion, the FP8-scaled activation split, the
// grouped grid raster and the epilogue (INT8 scale, accumulate, stores). All kernels use these
// same functions, so the only arithmetic that could differ between them is the MMA sequence
// itself, which all issue in the order of ops_mma_gemm.h. Device code; include from .cu files only.
#pragma once
#include <cstdint>
#include <type_traits>

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

// Shared-memory swizzles of the cp.async kernels' tiles (ops_mma_gemm_pipelined.cu,
// ops_mma_gemm_wgmma.cu). x stage [rows][32] f32: physical 16-byte chunk of logical chunk q (0..7)
// in row r is q ^ 2(r mod 4), so the 8-byte A fragment loads of a half warp (rows g = 0..3,
// logical chunks {c, c+1}, c even) touch the chunk pairs c ^ {0, 2, 4, 6}: all 32 banks once.
__device__ __forceinline__ int x_chunk(int r, int q) { return q ^ ((r & 3) << 1); }
// bf16 W tile [rows][32] (64-byte rows): physical chunk of logical chunk q (0..3) in row n is
// q ^ ((n / 2) mod 4). Rows n and n+1 share a 128-byte line (halves 0 and 1), so the 8 rows of an
// ldmatrix 8x8 matrix (one chunk each) land in 8 different 16-byte bank groups; so do the
// conversion stores of 8 threads. It is also wgmma's 64-byte swizzle (wgmma.cuh desc_sw64).
__device__ __forceinline__ int w_chunk(int n, int q) { return q ^ ((n >> 1) & 3); }

// The cp.async tile loads of those kernels (16-byte chunk c of a tile with k0 its first k;
// zero-fill outside [M, N, K]):
//   x stage [rows][32] f32 at shared address sx: chunk c = row c/8, floats 4(c%8) .. +3;
__device__ __forceinline__ void copy_x_chunk(uint32_t sx, const float* __restrict__ x, int M, int K, int m0, int k0,
                                             int c) {
  const int r = c >> 3, q = c & 7, m = m0 + r, k = k0 + q * 4;
  const bool ok = m < M && k < K;
  mma_frag::cp_async16(sx + uint32_t(r * 128 + x_chunk(r, q) * 16), ok ? x + size_t(m) * K + k : x, ok ? 16 : 0);
}
//   raw e4m3 / int8 W [rows][32] bytes at sw: chunk c = row c/2, bytes 16(c%2) .. +15, at byte 16c;
__device__ __forceinline__ void copy_w_raw_chunk(uint32_t sw, const uint8_t* __restrict__ w, int N, int K, int n0,
                                                 int k0, int c) {
  const int r = c >> 1, q = c & 1, n = n0 + r, k = k0 + q * 16;
  const bool ok = n < N && k < K;
  mma_frag::cp_async16(sw + uint32_t(c * 16), ok ? w + size_t(n) * K + k : w, ok ? 16 : 0);
}
//   bf16 W [rows][32] at sw: chunk c = row c/4, bf16 8(c%4) .. +7, swizzled by w_chunk.
__device__ __forceinline__ void copy_w_bf16_chunk(uint32_t sw, const uint8_t* __restrict__ w, int N, int K, int n0,
                                                  int k0, int c) {
  const int r = c >> 2, q = c & 3, n = n0 + r, k = k0 + q * 8;
  const bool ok = n < N && k < K;
  mma_frag::cp_async16(sw + uint32_t(r * 64 + w_chunk(r, q) * 16), ok ? w + (size_t(n) * K + k) * 2 : w,
                       ok ? 16 : 0);
}
// Raw chunk c (as copy_w_raw_chunk placed it in raw_tile) -> its 32 bf16 bytes in the bf16 W tile
// (row c/2, logical chunks 2(c%2) and 2(c%2) + 1, swizzled by w_chunk), exactly.
template <WKind kKind>
__device__ __forceinline__ void convert_w_chunk(const unsigned char* raw_tile, unsigned char* bf16_tile, int c) {
  const uint4 raw = *reinterpret_cast<const uint4*>(raw_tile + c * 16);
  uint4 lo, hi;
  convert16<kKind>(raw, lo, hi);
  const int r = c >> 1, q = c & 1;
  unsigned char* row = bf16_tile + r * 64;
  *reinterpret_cast<uint4*>(row + w_chunk(r, 2 * q) * 16) = lo;
  *reinterpret_cast<uint4*>(row + w_chunk(r, 2 * q + 1) * 16) = hi;
}

// The activation pair (a, b) of k block kb -> bf16 hi and lo pairs (split2). FP8: first
// a' = a ⊗ s, b' = b ⊗ s with s = scale[n/128][kb] of the outputs the fragment feeds (one f32
// multiply each: the block scale moves from the weight to the activation, ops_mma_gemm.h); bf16
// and INT8: s is ignored.
template <WKind kKind>
__device__ __forceinline__ void split2_scaled(float a, float b, float s, uint32_t& hi, uint32_t& lo) {
  if constexpr (kKind == WKind::Fp8) {
    a = __fmul_rn(a, s);
    b = __fmul_rn(b, s);
  }
  mma_frag::split2(a, b, hi, lo);
}

// Epilogue of one warp: its MI x NI m16n8 fragments start at output (row0, col0). Fragment
// element e of (mi, ni) is row g (+8 for e >= 2), column 2t + (e & 1) (g = lane/4, t = lane%4).
// v = c; INT8: v = v ⊗ scale[n]; accumulate: y = y_old ⊕ v.
template <WKind kKind, int MI, int NI>
__device__ __forceinline__ void store_fragments(const float (&c)[MI][NI][4], int row0, int col0, int lane, int M,
                                                int N, const float* __restrict__ scale, float* __restrict__ y,
                                                bool accumulate) {
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
        float v0 = c[mi][ni][2 * h];
        float v1 = c[mi][ni][2 * h + 1];
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

// Host: calls launch(std::integral_constant<WKind, kind>{}, weight bytes, scales or nullptr) for
// the kernel kind of w's storage format (the per-format dispatch of every mma_gemm launcher).
template <class Launch>
void dispatch_weight_kind(const DeviceLinear& w, Launch&& launch) {
  switch (w.format) {
    case quant::WeightFormat::Fp8Block:
      launch(std::integral_constant<WKind, WKind::Fp8>{}, w.fp8.data(), w.scale.data());
      break;
    case quant::WeightFormat::Int8Rowwise:
      launch(std::integral_constant<WKind, WKind::Int8>{}, reinterpret_cast<const uint8_t*>(w.int8.data()),
             w.scale.data());
      break;
    default:  // Dense, NVFP4 (bf16 at load)
      launch(std::integral_constant<WKind, WKind::Bf16>{}, reinterpret_cast<const uint8_t*>(w.dense.data()),
             static_cast<const float*>(nullptr));
      break;
  }
}

}  // namespace moeserve::cuda::mma_gemm_detail

namespace moeserve::cuda {
// The pipelined Large kernel (ops_mma_gemm_pipelined.cu), launched by mma_gemm (ops_mma_gemm.cu).
// The kernel of MmaTiling::LargePipelined (128x128, 1 CTA per SM), LargePipelined2Cta (128x128
// at <= 128 registers, 2 CTAs per SM) or Wide (128x256).
enum class PipelinedKernel { Tile128, Tile128TwoCtas, Wide };
void mma_gemm_pipelined_launch(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate,
                               cudaStream_t stream, PipelinedKernel kernel);
void mma_gemm_pipelined_prepare();
// The wgmma kernels (ops_mma_gemm_wgmma.cu): output tiles of 128 rows x bn (128 or 256) columns.
// Throw where mma_gemm_wgmma_available() is false.
void mma_gemm_wgmma_launch(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate,
                           cudaStream_t stream, int bn);
void mma_gemm_wgmma_prepare();
}  // namespace moeserve::cuda
