// Device steps shared by the two paged_attention_prefill tensor-core kernels (the 4-warp kernel of
// ops_attention_mma.cu and the 8-warp kernel of ops_attention_mma_wide.cu): the S = Q·Kᵀ MMA chain of one 32-position KV tile, the online softmax of the tile, the rescale of
// O, the P·V MMA chain and the gated output. Both kernels call these same functions, so the
// arithmetic contract written in ops_attention_mma.cu's header is stated once and computed by one
// piece of code; the kernels differ only in how they lay out, copy and address the tiles (which the
// callers pass in as shared-memory addresses or address functors).
//
// Fragment layout (mma.sync m16n8k16, this thread = lane, g = lane / 4, tq = lane % 4): the warp
// owns 16 MMA rows; s[n][e] is row g + 8·(e >> 1), tile position 8n + 2·tq + (e & 1); o[n][e] is
// row g + 8·(e >> 1), dim 8n + 2·tq + (e & 1). Everything here is register work (plus ldmatrix from
// the shared-memory addresses the caller gives); no global memory except the final gate / out.
// Device code; include from .cu files only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/ops_mma_frag.cuh"

namespace moeserve::cuda::attn_mma {

constexpr int kBc = 32;       // KV positions per tile (the fixed online-softmax granularity)
constexpr int kSN = kBc / 8;  // n8 tiles of S per warp
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Element offset of (row r, 16-byte chunk c) in a swizzled [rows][kHd] bf16 plane: chunk c of row
// r is stored at chunk c ^ (r & 7), so the 8 row addresses of an ldmatrix hit 8 bank groups.
template <int kHd>
__device__ __forceinline__ int swz(int r, int c) {
  return r * kHd + ((c ^ (r & 7)) << 3);
}

template <int kN>
__device__ __forceinline__ void zero_fragments(float (&f)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) f[n][e] = 0.f;
}

// S += Q · Kᵀ over the kHd dims of one tile (s from zero): per k16 step in ascending dims, every
// n8 tile gets mma(hi) and then every n8 tile mma(lo). load_q(ks, ah, al) fills the warp's A
// fragments (hi, lo planes) of step ks; k_addr(ks, np) is the ldmatrix.x4 address of K for n8 tile
// pair np (x4 matrices: (pos 0-7, k 0-7), (pos 0-7, k 8-15), (pos 8-15, k 0-7), (pos 8-15, k 8-15)).
template <int kHd, class LoadQ, class KAddr>
__device__ __forceinline__ void qk_tile(float (&s)[kSN][4], LoadQ&& load_q, KAddr&& k_addr) {
#pragma unroll 4
  for (int ks = 0; ks < kHd / 16; ++ks) {
    uint32_t ah[4], al[4];
    load_q(ks, ah, al);
    uint32_t b[kSN][2];
#pragma unroll
    for (int np = 0; np < kSN / 2; ++np) {
      uint32_t r4[4];
      mma_frag::ldmatrix_x4(k_addr(ks, np), r4);
      b[2 * np][0] = r4[0], b[2 * np][1] = r4[1], b[2 * np + 1][0] = r4[2], b[2 * np + 1][1] = r4[3];
    }
#pragma unroll
    for (int n = 0; n < kSN; ++n) mma_frag::mma_bf16(s[n], ah, b[n][0], b[n][1]);
#pragma unroll
    for (int n = 0; n < kSN; ++n) mma_frag::mma_bf16(s[n], al, b[n][0], b[n][1]);
  }
}

// Online softmax of one tile for this thread's two rows: s (scores) becomes P; m_run, l_run are
// updated and corr[i] is row i's rescale of O. visible(i, n, c): position 8n + 2·tq + c of the tile
// is causal for row i (masked positions are excluded by selects: S → −inf, P → 0).
//   tmax = max over the tile; m' = max(m, tmax); corr = (m' == m) ? 1 : ex2.approx(m − m');
//   P = ex2.approx(S − m'); l = fma(l, corr, rowsum), rowsum in ascending n8 tile, column order
//   per thread, then two xor shuffles (a + b == b + a: all four threads of the quad agree).
template <class Visible>
__device__ __forceinline__ void tile_softmax(float (&s)[kSN][4], float (&m_run)[2], float (&l_run)[2],
                                             float (&corr)[2], Visible&& visible) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float tmax = -INFINITY;
#pragma unroll
    for (int n = 0; n < kSN; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const bool valid = visible(i, n, c);
        tmax = fmaxf(tmax, valid ? s[n][2 * i + c] : -INFINITY);
      }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float m_new = fmaxf(m_run[i], tmax);
    corr[i] = m_new == m_run[i] ? 1.0f : exp2_approx(__fsub_rn(m_run[i], m_new));
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kSN; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const bool valid = visible(i, n, c);
        const float p = valid ? exp2_approx(__fsub_rn(s[n][2 * i + c], m_new)) : 0.0f;
        s[n][2 * i + c] = p;
        sum = (n == 0 && c == 0) ? p : __fadd_rn(sum, p);
      }
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
    l_run[i] = __fmaf_rn(l_run[i], corr[i], sum);
    m_run[i] = m_new;
  }
}

// O ⊗ corr per row (skipped when both are 1: O ⊗ 1 is exact, so skipping changes no bit).
template <int kON>
__device__ __forceinline__ void rescale_o(float (&o)[kON][4], const float (&corr)[2]) {
  if (corr[0] != 1.0f || corr[1] != 1.0f) {
#pragma unroll
    for (int n = 0; n < kON; ++n) {
      o[n][0] = __fmul_rn(o[n][0], corr[0]);
      o[n][1] = __fmul_rn(o[n][1], corr[0]);
      o[n][2] = __fmul_rn(o[n][2], corr[1]);
      o[n][3] = __fmul_rn(o[n][3], corr[1]);
    }
  }
}

// O += P · V: k16 step ks covers tile positions 16ks .. +15 = S tiles 2ks and 2ks + 1 (P split
// into hi + lo like q); per pair of n8 dim tiles dp: mma(hi) on both, then mma(lo) on both.
// v_addr(ks, dp) is the ldmatrix.x4.trans address of V for dim tiles 2dp, 2dp + 1 (x4 matrices:
// (pos 0-7, dims 0-7), (pos 8-15, dims 0-7), (pos 0-7, dims 8-15), (pos 8-15, dims 8-15)).
template <int kON, class VAddr>
__device__ __forceinline__ void pv_tile(float (&o)[kON][4], float (&s)[kSN][4], VAddr&& v_addr) {
#pragma unroll
  for (int ks = 0; ks < kBc / 16; ++ks) {
    uint32_t ph[4], pl[4];
    mma_frag::split2(s[2 * ks][0], s[2 * ks][1], ph[0], pl[0]);          // row g,     k 2tq, 2tq+1
    mma_frag::split2(s[2 * ks][2], s[2 * ks][3], ph[1], pl[1]);          // row g + 8, k 2tq, 2tq+1
    mma_frag::split2(s[2 * ks + 1][0], s[2 * ks + 1][1], ph[2], pl[2]);  // row g,     k 2tq+8, +9
    mma_frag::split2(s[2 * ks + 1][2], s[2 * ks + 1][3], ph[3], pl[3]);  // row g + 8, k 2tq+8, +9
#pragma unroll
    for (int dp = 0; dp < kON / 2; ++dp) {
      uint32_t r4[4];
      mma_frag::ldmatrix_x4_trans(v_addr(ks, dp), r4);
      mma_frag::mma_bf16(o[2 * dp], ph, r4[0], r4[1]);
      mma_frag::mma_bf16(o[2 * dp + 1], ph, r4[2], r4[3]);
      mma_frag::mma_bf16(o[2 * dp], pl, r4[0], r4[1]);
      mma_frag::mma_bf16(o[2 * dp + 1], pl, r4[2], r4[3]);
    }
  }
}

// out = (O ÷ l) ⊗ sigmoid(gate), sigmoid(g) = 1 ÷ (1 ⊕ ex2.approx(−g ⊗ log2 e)), for this thread's
// rows i (rpos[i] < 0: padding, not stored); row_base(i) is row i's element offset in a.gate / a.out
// (Args: the kernel's argument struct, read here where the stores need it).
template <int kHd, class Args, class RowBase>
__device__ __forceinline__ void store_gated_output(float (&o)[kHd / 8][4], const float (&l_run)[2],
                                                   const int (&rpos)[2], int tq, const Args& a, RowBase&& row_base) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (rpos[i] < 0) continue;
    const size_t base = row_base(i);
    const float L = l_run[i];
#pragma unroll
    for (int n = 0; n < kHd / 8; ++n) {
      const int d = 8 * n + 2 * tq;
      const float2 gv = *reinterpret_cast<const float2*>(a.gate + base + d);
      const float s0 = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp2_approx(__fmul_rn(-gv.x, kLog2e))));
      const float s1 = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp2_approx(__fmul_rn(-gv.y, kLog2e))));
      float2 r;
      r.x = __fmul_rn(__fdiv_rn(o[n][2 * i], L), s0);
      r.y = __fmul_rn(__fdiv_rn(o[n][2 * i + 1], L), s1);
      *reinterpret_cast<float2*>(a.out + base + d) = r;
    }
  }
}

}  // namespace moeserve::cuda::attn_mma
