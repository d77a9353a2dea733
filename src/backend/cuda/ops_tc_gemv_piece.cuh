// The operand pieces of tc_gemv's arithmetic (ops_tc_gemv.h) that its mma.sync kernels
// (ops_tc_gemv.cu) and its wgmma form (ops_tc_gemv_wgmma.cu) share, so that every form has the same
// bits: the activation split (one warp converts one (token, 128-k block) unit, lane L the 4 physical
// k 4L .. 4L + 3) and the weight side (a thread's 16-byte loads of its rows g and g + 8 per 64-k
// chunk, and the A registers built from them). Device code; include from .cu files only.
#pragma once
#include <cstdint>

#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_tc_gemv_frag.cuh"
#include "backend/cuda/row_weight_format.cuh"

namespace moeserve::cuda::tc_piece {

// ops_basic.cu's silu_mul_value, the same expression (the gated test checks the bits).
__device__ __forceinline__ float silu_mul_value(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// Lane L's piece of token m's block b from global memory (planes kernels: x written by the previous
// kernel, read through L2): x[m][k .. k + 3] at k = 128·b + 4·L, gated silu(g)·u with
// silu_mul_value; past K (K % 16 == 0: a 16-byte piece is whole or past the row) zeros, gated
// silu_mul_value(0, 0), as the in-CTA staging reads them.
template <bool kGated>
__device__ __forceinline__ float4 load_piece(const float* __restrict__ x, const float* __restrict__ u, int K, int m,
                                             int k) {
  if (k >= K) {
    if constexpr (kGated) {
      const float z = silu_mul_value(0.0f, 0.0f);
      return make_float4(z, z, z, z);
    }
    return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const size_t off = size_t(m) * size_t(K) + size_t(k);
  float4 v = __ldcg(reinterpret_cast<const float4*>(x + off));
  if constexpr (kGated) {
    const float4 w = __ldcg(reinterpret_cast<const float4*>(u + off));
    v = make_float4(silu_mul_value(v.x, w.x), silu_mul_value(v.y, w.y), silu_mul_value(v.z, w.z),
                    silu_mul_value(v.w, w.w));
  }
  return v;
}

// Lane L's piece of a unit, converted for format F's MMAs: the fragment coordinates (k16 step i8
// of the block, thread t4 of the MMA's B layout) of its four values, the hi / lo pairs (h0, l0: the
// piece's k 4L, 4L + 1 = the B registers' logical k 2·t4, 2·t4 + 1 of step i8; h1, l1: 4L + 2, 4L
// + 3 = logical 8 + 2·t4, +1), and the unit's 2^-P (FP8 / INT8: f16 split of x·2^P with P from the
// warp's max |x|; bf16: bf16 split, 2^-P = 1). The whole warp calls it (a shuffle max).
template <int F>
__device__ __forceinline__ float split_piece(float4 v, int lane, int& i8, int& t4, uint32_t& h0, uint32_t& h1,
                                             uint32_t& l0, uint32_t& l1) {
  using row_format::kBf16;
  const int c = lane >> 4, f = lane & 15;
  t4 = F == kBf16 ? (f & 7) >> 1 : f >> 2;
  i8 = F == kBf16 ? 4 * c + 2 * (f >> 3) + (f & 1) : 4 * c + (f & 3);
  float pinv = 1.0f;
  if constexpr (F == kBf16) {
    mma_frag::split2(v.x, v.y, h0, l0);
    mma_frag::split2(v.z, v.w, h1, l1);
  } else {
    float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const int e = int((__float_as_uint(a) >> 23) & 0xFFu) - 127;  // ilogb(a) for normal a
    const int P = a == 0.0f ? 0 : min(14 - e, 126);               // subnormal a: e = -127 -> clamped
    const float sc = tc_frag::exp2i(P);
    tc_frag::split_f16(__fmul_rn(v.x, sc), __fmul_rn(v.y, sc), h0, l0);
    tc_frag::split_f16(__fmul_rn(v.z, sc), __fmul_rn(v.w, sc), h1, l1);
    pinv = tc_frag::exp2i(-P);
  }
  return pinv;
}

// ---- the weight side: thread (g = lane / 4, t4 = lane % 4) of a warp owning 16 rows ----

template <int F>
inline constexpr int kLoadsPerRow = F == row_format::kBf16 ? 2 : 1;  // 16-byte loads per row and chunk
template <int F>
inline constexpr int kChunkBytes = F == row_format::kBf16 ? 128 : 64;  // one row's chunk

// One ring slot: a thread's weights of one 64-k chunk for rows g (w[0]) and g + 8 (w[1]).
template <int F>
struct Slot {
  uint4 w[2][kLoadsPerRow<F>];
};

// The thread's weight stream: running pointers at its next chunk to request (FP8 / INT8 bytes 16·t4
// of the chunk, bf16 16·t4 and 64 + 16·t4), chunks counted from block bb. kWhole (K % 128 == 0):
// no bounds test; else loads past K give zeros (zero weights times zero-padded x).
template <int F, bool kWhole>
struct WeightFeed {
  const uint8_t* wp0;
  const uint8_t* wp8;
  int bb, K, t4;
  int next_chunk = 0;  // the next chunk to request (relative to bb)

  // The feed of thread (g, t4) of the warp owning rows n0 .. n0 + 15 of W [N, K] (rows past N repeat
  // N − 1; their outputs are not stored), from 128-k block bb on.
  static __device__ __forceinline__ WeightFeed at(const uint8_t* w, int N, int K, int n0, int g, int bb, int t4) {
    const size_t row_bytes = size_t(K) * (F == row_format::kBf16 ? 2 : 1);
    const size_t off = size_t(bb) * (2 * kChunkBytes<F>) + 16 * t4;
    return WeightFeed{w + size_t(min(n0 + g, N - 1)) * row_bytes + off,
                      w + size_t(min(n0 + g + 8, N - 1)) * row_bytes + off, bb, K, t4};
  }

  // Requests the next chunk into s (streaming loads, no L1 allocation).
  __device__ __forceinline__ void request(Slot<F>& s) {
#pragma unroll
    for (int j = 0; j < kLoadsPerRow<F>; ++j) {
      // k of this load: the chunk's first k + (FP8 / INT8: 16·t4; bf16: 32·j + 8·t4).
      const int k = (bb * 2 + next_chunk) * 64 + (F == row_format::kBf16 ? 32 * j + 8 * t4 : 16 * t4);
      if (kWhole || k < K) {
        s.w[0][j] = tc_frag::ld_stream128(wp0 + 64 * j);
        s.w[1][j] = tc_frag::ld_stream128(wp8 + 64 * j);
      } else {
        s.w[0][j] = make_uint4(0, 0, 0, 0);
        s.w[1][j] = make_uint4(0, 0, 0, 0);
      }
    }
    wp0 += kChunkBytes<F>;
    wp8 += kChunkBytes<F>;
    ++next_chunk;
  }

  // Prefetches 128-k block blk (relative to bb: chunks 2·blk and 2·blk + 1) of rows g and g + 8 into
  // L2, one 128-byte line per lane: FP8 / INT8 (a block is one line of a row) lanes t4 0 / 1 rows g /
  // g + 8; bf16 (two lines) t4 0, 1 row g's, 2, 3 row g + 8's. Rows start on 128-byte lines when K %
  // 128 == 0 (else a line may be the neighbour's: still only a hint). Past K nothing is prefetched.
  __device__ __forceinline__ void prefetch_block(int blk) const {
    constexpr bool kB = F == row_format::kBf16;
    if (!kB && t4 >= 2) return;
    const int chunk = 2 * blk + (kB ? (t4 & 1) : 0);
    if (!kWhole && (bb * 2 + chunk) * 64 >= K) return;
    const bool r8 = kB ? (t4 >> 1) != 0 : t4 == 1;
    const uint8_t* p = (r8 ? wp8 : wp0) + ptrdiff_t(chunk - next_chunk) * kChunkBytes<F>;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  }
};

// A registers of k16 step s (0..3) of the chunk held in a slot (mma.m16n8k16's A layout, which is
// also wgmma's register A fragment per warp): FP8 two exact cvt e4m3x2 -> f16x2 per word, INT8 XOR
// 0x80 + PRMT + HSUB2 (exact), bf16 the loaded words.
template <int F>
__device__ __forceinline__ void a_frag(const Slot<F>& sl, int s, uint32_t (&a)[4]) {
  if constexpr (F == row_format::kBf16) {
    const int j = s >> 1, o = 2 * (s & 1);
    const uint32_t* r0 = reinterpret_cast<const uint32_t*>(&sl.w[0][j]);
    const uint32_t* r8 = reinterpret_cast<const uint32_t*>(&sl.w[1][j]);
    a[0] = r0[o], a[1] = r8[o], a[2] = r0[o + 1], a[3] = r8[o + 1];
  } else if constexpr (F == row_format::kFp8) {
    const uint32_t v0 = reinterpret_cast<const uint32_t*>(&sl.w[0][0])[s];
    const uint32_t v8 = reinterpret_cast<const uint32_t*>(&sl.w[1][0])[s];
    a[0] = tc_frag::e4m3x2_lo_to_f16x2(v0), a[1] = tc_frag::e4m3x2_lo_to_f16x2(v8);
    a[2] = tc_frag::e4m3x2_hi_to_f16x2(v0), a[3] = tc_frag::e4m3x2_hi_to_f16x2(v8);
  } else {
    const uint32_t v0 = reinterpret_cast<const uint32_t*>(&sl.w[0][0])[s] ^ 0x80808080u;
    const uint32_t v8 = reinterpret_cast<const uint32_t*>(&sl.w[1][0])[s] ^ 0x80808080u;
    a[0] = tc_frag::i8x2_to_f16x2(v0, 0x5150u), a[1] = tc_frag::i8x2_to_f16x2(v8, 0x5150u);
    a[2] = tc_frag::i8x2_to_f16x2(v0, 0x5352u), a[3] = tc_frag::i8x2_to_f16x2(v8, 0x5352u);
  }
}

// The epilogue of every form: output v of token row m and weight row n (the slice fold done) into
// y [M, N]: INT8 multiplies by its row scale rs first (one __fmul_rn; rs unused otherwise), then y
// = v, or y = y + v with accumulate. y_value is that value given y's old value (callers that read
// it ahead of the sums); y_at the element.
template <int F>
__device__ __forceinline__ float y_value(float v, float rs, int accumulate, float old) {
  if constexpr (F == row_format::kInt8) v = __fmul_rn(v, rs);
  return accumulate ? __fadd_rn(old, v) : v;
}
__device__ __forceinline__ float& y_at(float* y, int N, int m, int n) { return y[size_t(m) * size_t(N) + n]; }
template <int F>
__device__ __forceinline__ void store_y(float* y, int N, int m, int n, float v, float rs, int accumulate) {
  float& p = y_at(y, N, m, n);
  p = y_value<F>(v, rs, accumulate, accumulate ? p : 0.0f);
}

// Stores a warp's accumulator tile: rows n0 + g (+ 8) of the job's outputs and tokens m0 + 8·j + 2·t4
// (+ 1) for n8 blocks j < NB, the mma.sync C layout (element i of block j: row half i >> 1, token
// parity i & 1); acc(j, i) gives that element's value. Rows past job.N and tokens past mt are
// skipped; the INT8 row scale is read once per row.
template <int F, int NB, typename Job, typename Acc>
__device__ __forceinline__ void store_acc_tile(const Job& job, int n0, int g, int t4, int m0, int mt, Acc acc) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int n = n0 + g + 8 * (i >> 1);
    if (n >= job.N) continue;
    const float rs = F == row_format::kInt8 ? __ldg(job.scale + n) : 1.0f;
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const int m = 8 * j + 2 * t4 + (i & 1);
      if (m >= mt) continue;
      store_y<F>(job.y, job.N, m0 + m, n, acc(j, i), rs, job.accumulate);
    }
  }
}

}  // namespace moeserve::cuda::tc_piece
