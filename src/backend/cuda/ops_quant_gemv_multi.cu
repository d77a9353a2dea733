// Row GEMVs of generated tokens over f32 activations: row_gemv_f32 and row_gemv_f32_gated
// (ops_quant_gemv.h). quant_gemv / quant_gemv_multi with f32 x and f32 y, and
// linear_f32_input(_multi) (ops_small_linear.h), route here whenever row_gemv_supported().
//
// Layout. x f32 [M, K] row-major, 16-byte aligned rows (K % 4 == 0, 16-byte aligned base);
// gated: g, u f32 [M, K] and x = silu(g)·u, computed exactly as silu_mul_split does. W [N, K]
// row-major: FP8 e4m3 with f32 block-128 scales [ceil(N/128), ceil(K/128)], INT8 with f32 row
// scales [N], or bf16 (Dense, and NVFP4 dequantised at load). y f32 [M, N] (= or +=).
//
// Arithmetic of one output y[m, n], the same for every M, tile, grid, kernel, variant and set
// of jobs (batch invariance; a job's bits equal those of a launch of its own):
//   w'[k] = FP8: the exact f32 dequantised weight (fp8·block scale rounded once to f32, as the
//           CPU reference computes it); INT8: q itself (exact), the row scale multiplies the
//           finished sum (one rounding, below); bf16 as is.
//   K is cut into steps of 512 k. In step t, lane L owns the 16 k = 512t + 128i + 4L + j
//   (i, j = 0..3): each group of 4 consecutive k is one 16-byte x load, so a warp's x loads
//   cover 512 contiguous bytes (no L1 replays); group i lies in scale block 4t + i.
//   The steps are cut into S(K) slices of T(K) consecutive steps (S = 1, 2, 4 or 8, the fewest
//   with T <= 4: K = 8192 -> 4 slices of 4 steps, K = 3072 -> 2 of 3, K = 1024 -> 1 of 2).
//   A lane keeps ONE fma chain y += w'[k]·x[k] over its k of its slice in (t, i, j) order (k >= K
//   skipped); a slice's 32 lanes are summed by an xor shuffle tree (16, 8, 4, 2, 1); the slices
//   are added in slice order (empty slices add +0); INT8 then multiplies by the row scale;
//   accumulate then adds that sum to y (one rounding).
// Two kernels compute exactly this; which one serves a launch depends on M only:
//
// M <= 2 (generated tokens of one or two sequences: latency- and bandwidth-bound):
// row_gemv_f32_stream_kernel. A warp owns R consecutive rows of one job over ALL of K: it runs
// the slices one after the other, each with its own shuffle tree, so there are no partial sums
// in shared memory and no barrier (gated: one, after the fill below). Its weights stream
// through a ring of D steps x R rows, requested before any is used; each slot is refilled as
// soon as its step is consumed, so every warp keeps about D·R·512 B (FP8/INT8) in flight from
// its first to its last step. R = 4 when the launch's rows leave a full wave of warps (>= 64 rows
// per SM: the LM head, q_proj, in_proj; each x load serves 4 rows; at one token a one-step ring
// in 80 registers, 3 CTAs per SM: RowGemvRows::Wide, launch_small_m); otherwise R = 1 (3 CTAs per
// SM: o_proj / out_proj 3072 x 8192 is one wave of 384 CTAs; the router set); two tokens under
// Wide take R = 2 at 3 CTAs per SM. FP8: a warp's rows share one 128-row scale block: one scale
// load per step serves them all. The ring has two feeds (RowGemvFeed, set_row_gemv_feed; the same
// arithmetic, the same bits; the table of D per feed: launch_small_m):
//   Registers: a lane loads its own groups into registers (FP8/INT8: 4-byte loads, one
//     128-byte line per warp instruction; bf16 8-byte loads, D/2 steps): R = 4, D = 3 (2 at two
//     tokens); R = 1, D = 8 (4 at two tokens or gated).
//   Lean (default; K % 512 == 0, else Registers): the Registers ring with lean addressing
//     (stream_rows_lean): a running pointer per row, per FP8 scale row and for x, advanced once
//     per step, the 4 groups as immediate offsets, no per-lane k < K tests. At one token these
//     kernels are bound by each warp's chain, not by bytes (docs/PERF.md runs S1-S4: ~10
//     instructions per weight before, ~4.5 after; run S22-1: 5.5 with the loop, 34% of stalls
//     on a weight load, 36% on another warp's issue); R = 4, D = 1 at one token (3 CTAs per
//     SM), else 2; R = 1, D = 4.
//   x stays on the L1 path (__ldg, 16 B per lane); gated: the tile's silu(g)·u is the kernel's
//   dynamic shared memory (MT·K·4 <= kGatedSmem, no opt-in).
//
// M >= 3 (gated: M >= 2 with K <= 5888): row_gemv_f32_kernel. A CTA is 8 warps = 8/S row
// groups x S slices; a warp takes R consecutive output rows of one job over its slice (each x
// load serves the R rows) and a tile of MT tokens (each weight load, converted once, serves the
// MT tokens from registers); it issues the loads of D steps x R rows of its slice before it
// uses any. The slices of a row meet in shared memory after one barrier. (MT, R, D): M <= 4:
// (4, 2, 4) (gated M = 2: (2, 2, 4)); else tiles of 8 tokens (8, 4, 1); gated tiles shrink for
// long K, down to one token (then the streaming kernel, one tile per token). Many tokens per
// weight load is what makes M = 8 fast; it needs the registers that one token spends on loads
// in flight, hence two kernels. Second form of the token tiles (set_row_gemv_tiled_variant,
// row_gemv_f32_tiled_smem_kernel, the same (MT) choice and the same bits): a CTA is 32 rows
// (8 warps x 4; 24 where that balances a short launch) over all of K in the streaming
// kernel's slice-after-slice order, x staged once per CTA through shared memory one step
// ahead, weights one step ahead in registers (its section below).
//
// Both: the weights bypass L1, which keeps x. The grid is 1-D, CTA b = row block b / tiles and
// token tile b % tiles, so the tiles that read one weight slice run together (the later ones
// hit L2). Up to kMaxRowJobs jobs (any mix of the three formats, one K, the same x) own
// consecutive row blocks; each CTA serves one job. Gated: the CTA first issues its first weight
// loads, then writes silu(g)·u of its MT tokens (all of K) to shared memory, then reads x from
// there (MT·K·4 <= 46 KB: smaller token tiles for long K).
// PDL (pdl.cuh, M <= 64): each CTA triggers its dependents at entry, issues its first weight
// loads, and only then waits for the previous kernel (griddepcontrol.wait) before it reads x,
// g, u or touches y: the weights are never written by another kernel.
// Roofline: the weight bytes once per call (N·K·{1, 1, 2} + scales) plus x (M·K·4 per CTA, from
// L2) and y. Per weight at one token a lane spends about 4 instructions (convert, FP8 scale
// multiply, fma, its share of loads and x), well under the issue rate that the HBM bandwidth
// asks for, so M <= 2 is bound by the bytes in flight (the ring; Little's law: the bytes in
// flight per SM must cover the HBM bandwidth per SM times the memory latency). At one token
// and one row per warp x is 4 bytes per weight (f32, from L1): the L1 data path carries it
// beside the weights. At M = 8 the FMAs (8 per weight on CUDA cores) and the x loads from L1
// (16 B per 4 weights per token per R rows) take about as long as the FP8 bytes: CUDA cores
// cannot do better there.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <type_traits>
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ops_quant_gemv.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/row_weight_format.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStep = 512;  // k per warp step: 32 lanes x 16
using namespace row_format;  // kFp8 / kInt8 / kBf16, fmt_of, with_format

// Gated: the tile's silu(g)·u in dynamic shared memory, at most this much, so that with the
// static partial sums (<= 1 KB) a CTA stays within the 48 KB that need no opt-in.
constexpr size_t kGatedSmem = 46 * 1024;
constexpr int kPdlMaxRows = 64;  // launches of up to this many rows of x use PDL

struct Job {
  const uint8_t* w;
  const float* scale;  // FP8 block scales, INT8 row scales, bf16: unused
  float* y;
  int N;
  int fmt;
  int block_begin;  // first row block of this job
  int accumulate;
};
struct Jobs {
  Job job[kMaxRowJobs];
  int count;
  int early_loads = 1;  // the lean streaming kernel's first weight loads before griddepcontrol.wait (1) or after
};

// Slices of the K steps: a function of K only (the reduction order may not depend on more).
struct KSplit {
  int steps, S, T;
};
KSplit k_split(int K) {
  KSplit s{(K + kStep - 1) / kStep, 1, 0};
  while (s.S < 8 && s.steps > 4 * s.S) s.S *= 2;
  s.T = (s.steps + s.S - 1) / s.S;
  return s;
}

// Streaming weight loads: read once, kept out of L1 (which holds x). volatile: issued where
// written, i.e. before pdl_wait (the compiler may not sink them past it).
__device__ __forceinline__ uint32_t ld_stream32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_stream64(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// ops_basic.cu's silu_mul_value, the same expression (the gated test checks the bits).
__device__ __forceinline__ float silu_mul_value(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// The raw weights of one row and one step for this lane: group i = k 512t + 128i + 4L .. +3,
// which lies in scale block 4t + i for every lane; lane L loads the scale of block 4t + L % 4
// (one load per step instead of four) and the groups take it by shuffle (block_scales).
template <int F>
struct StepRaw {
  uint32_t v[F == kBf16 ? 8 : 4];
  float s;  // FP8 only
};

template <int F>
__device__ __forceinline__ void load_step_w(const uint8_t* __restrict__ row, int K, int t, StepRaw<F>& r) {
  const int kbase = t * kStep + 4 * (threadIdx.x & 31);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k = kbase + 128 * i;
    if (k < K) {
      if constexpr (F == kBf16) {
        const uint2 p = ld_stream64(row + size_t(k) * 2);
        r.v[2 * i] = p.x, r.v[2 * i + 1] = p.y;
      } else {
        r.v[i] = ld_stream32(row + k);
      }
    }
  }
}

template <int F>
__device__ __forceinline__ void load_step(const uint8_t* __restrict__ row, const float* __restrict__ srow, int K,
                                          int t, StepRaw<F>& r) {
  load_step_w<F>(row, K, t, r);
  if constexpr (F == kFp8) r.s = __ldg(srow + min(4 * t + (threadIdx.x & 3), (K + 127) / 128 - 1));
}

// The 4 block scales of a step (warp-uniform code: every lane of the warp calls it).
template <int F>
__device__ __forceinline__ void block_scales(const StepRaw<F>& r, float (&s)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = F == kFp8 ? __shfl_sync(0xffffffffu, r.s, i) : 1.0f;
}

// The 4 weights of group i as f32: FP8 the exact dequantised weight (one rounding of q·scale,
// as the CPU's); INT8 q itself (exact; the row scale multiplies the row's finished sum); bf16 as is.
template <int F>
__device__ __forceinline__ void convert_group(const StepRaw<F>& r, int i, float scale, float (&w)[4]) {
  if constexpr (F == kBf16) {
    w[0] = __uint_as_float(r.v[2 * i] << 16), w[1] = __uint_as_float(r.v[2 * i] & 0xFFFF0000u);
    w[2] = __uint_as_float(r.v[2 * i + 1] << 16), w[3] = __uint_as_float(r.v[2 * i + 1] & 0xFFFF0000u);
  } else if constexpr (F == kFp8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((r.v[i] >> (16 * h)) & 0xFFFFu), __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
      w[2 * h] = __fmul_rn(f.x, scale), w[2 * h + 1] = __fmul_rn(f.y, scale);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // int8 q -> f32 without the quarter-rate I2F: the float 2^23 + (q + 128) has the biased
      // byte as its low mantissa bits; subtracting 2^23 + 128 is exact.
      const uint32_t biased = __byte_perm(r.v[i] ^ 0x80808080u, 0x4B000000u, 0x7440u | unsigned(j));
      w[j] = __fsub_rn(__uint_as_float(biased), 8388736.0f);
    }
  }
}

// x[m, k .. k+3] of the tile: the activations (global, through L1), or silu(g)·u from the
// CTA's shared-memory copy (gated).
template <bool kGated>
__device__ __forceinline__ void load_x4(const float* __restrict__ xt, size_t off, float (&v)[4]) {
  float4 a;
  if constexpr (kGated)
    a = *reinterpret_cast<const float4*>(xt + off);
  else
    a = __ldg(reinterpret_cast<const float4*>(xt + off));
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}

// Gated: act[m, k] = silu(g[m0 + m, k])·u[m0 + m, k] for the tile's mt tokens, all of K, into
// shared memory, by the whole CTA of kN threads (coalesced 16-byte loads), then a barrier.
template <int kN = kThreads>
__device__ __forceinline__ void fill_act(const float* __restrict__ g, const float* __restrict__ u, int K, int m0,
                                         int mt, float* act) {
  const int q = K / 4;
  const float4* g4 = reinterpret_cast<const float4*>(g + size_t(m0) * K);
  const float4* u4 = reinterpret_cast<const float4*>(u + size_t(m0) * K);
  float4* a4 = reinterpret_cast<float4*>(act);
  for (int e = threadIdx.x; e < mt * q; e += kN) {
    const float4 a = __ldg(g4 + e), b = __ldg(u4 + e);
    a4[e] = make_float4(silu_mul_value(a.x, b.x), silu_mul_value(a.y, b.y), silu_mul_value(a.z, b.z),
                        silu_mul_value(a.w, b.w));
  }
  __syncthreads();
}

// One warp: rows n0 .. n0+R-1 (clamped to N-1; the extra rows are not stored), the tile's
// tokens (xt: its first token's row, mt of them), steps [t_begin, t_end) of its slice (possibly
// empty). acc[r][m]: the lane's fma chain. Every thread of the CTA calls this (the same
// instantiation: one job per CTA), so the barrier in fill_act is reached by all.
template <int F, int MT, int R, int kD, bool kGated>
__device__ __forceinline__ void warp_rows(const Job& job, const float* __restrict__ x, const float* __restrict__ u,
                                          float* act, int K, int n0, int m0, int mt, int t_begin, int t_end,
                                          float (&acc)[R][MT]) {
  constexpr size_t kElem = F == kBf16 ? 2 : 1;
  constexpr int D = F == kBf16 && kD > 1 ? kD / 2 : kD;  // steps per batch: the same bytes in flight
  const int kb = (K + 127) / 128;
  const uint8_t* rows[R];
  const float* srow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = min(n0 + r, job.N - 1);
    rows[r] = job.w + size_t(n) * size_t(K) * kElem;
    srow[r] = F == kFp8 ? job.scale + size_t(n / 128) * kb : nullptr;
  }
  StepRaw<F> raw[D][R];
  auto load_batch = [&](int t0) {
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (t0 + d < t_end) {
#pragma unroll
        for (int r = 0; r < R; ++r) load_step<F>(rows[r], srow[r], K, t0 + d, raw[d][r]);
      }
  };
  load_batch(t_begin);  // the first weights are in flight while the previous kernel finishes
  // PDL: x, g, u and y may be written or read by earlier kernels; the weights never are.
  pdl_wait();
  const float* xt;
  if constexpr (kGated) {
    fill_act(x, u, K, m0, mt, act);
    xt = act;
  } else {
    xt = x + size_t(m0) * K;
  }
  for (int t0 = t_begin; t0 < t_end; t0 += D) {
    if (t0 != t_begin) load_batch(t0);
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (t0 + d >= t_end) break;  // warp-uniform
      const int kbase = (t0 + d) * kStep + 4 * (threadIdx.x & 31);
      float bs[R][4];  // FP8 block scales of the step's 4 groups, per row
#pragma unroll
      for (int r = 0; r < R; ++r) block_scales<F>(raw[d][r], bs[r]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int k = kbase + 128 * i;
        if (k >= K) break;  // per lane (K % 512 != 0)
        float w[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) convert_group<F>(raw[d][r], i, bs[r][i], w[r]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m >= mt) break;
          float xv[4];
          load_x4<kGated>(xt, size_t(m) * K + k, xv);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[r][m] = fmaf(w[r][j], xv[j], acc[r][m]);
        }
      }
    }
  }
}


// warp_rows when every step is whole (K % 512 == 0), with lean addressing as in
// stream_rows_lean: running per-row weight and FP8-scale pointers (immediate offsets for the 4
// groups), a running x pointer, no per-lane k < K tests. The same loads in the same order, the
// same chains: bit-identical to warp_rows.
template <int F, int MT, int R, int kD, bool kGated>
__device__ __forceinline__ void warp_rows_lean(const Job& job, const float* __restrict__ x,
                                               const float* __restrict__ u, float* act, int K, int n0, int m0, int mt,
                                               int t_begin, int t_end, float (&acc)[R][MT]) {
  constexpr int kElem = F == kBf16 ? 2 : 1;
  constexpr int D = F == kBf16 && kD > 1 ? kD / 2 : kD;
  constexpr int kGroupBytes = 128 * kElem;
  constexpr int kStepBytes = kStep * kElem;
  const int lane = threadIdx.x & 31;
  const uint8_t* wp[R];
  const float* sp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = min(n0 + r, job.N - 1);
    wp[r] = job.w + size_t(n) * size_t(K) * kElem + size_t(t_begin) * kStepBytes + 4 * kElem * lane;
    sp[r] = F == kFp8 ? job.scale + size_t(n / 128) * size_t(K / 128) + 4 * t_begin + (lane & 3) : nullptr;
  }
  StepRaw<F> raw[D][R];
  auto load_batch = [&](int t0) {
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (t0 + d < t_end) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if constexpr (F == kBf16) {
              const uint2 p = ld_stream64(wp[r] + i * kGroupBytes);
              raw[d][r].v[2 * i] = p.x, raw[d][r].v[2 * i + 1] = p.y;
            } else {
              raw[d][r].v[i] = ld_stream32(wp[r] + i * kGroupBytes);
            }
          }
          wp[r] += kStepBytes;
          if constexpr (F == kFp8) {
            raw[d][r].s = __ldg(sp[r]);
            sp[r] += 4;
          }
        }
      }
  };
  load_batch(t_begin);  // the first weights are in flight while the previous kernel finishes
  pdl_wait();           // x, g, u and y: only after the previous kernel
  const float* xt;
  if constexpr (kGated) {
    fill_act(x, u, K, m0, mt, act);
    xt = act;
  } else {
    xt = x + size_t(m0) * K;
  }
  const float* xs = xt + size_t(t_begin) * kStep + 4 * lane;
  for (int t0 = t_begin; t0 < t_end; t0 += D) {
    if (t0 != t_begin) load_batch(t0);
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (t0 + d >= t_end) break;  // warp-uniform
      float bs[R][4];
#pragma unroll
      for (int r = 0; r < R; ++r) block_scales<F>(raw[d][r], bs[r]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float w[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) convert_group<F>(raw[d][r], i, bs[r][i], w[r]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m >= mt) break;
          float xv[4];
          load_x4<kGated>(xs, size_t(m) * K + 128 * i, xv);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[r][m] = fmaf(w[r][j], xv[j], acc[r][m]);
        }
      }
      xs += kStep;
    }
  }
}

// 2 CTAs per SM: the registers go to token tiles (M >= 3; one token: the streaming kernel).

template <int MT, int R, int D, bool kGated, bool kLean>
__global__ void __launch_bounds__(kThreads, 2)
    row_gemv_f32_kernel(const float* __restrict__ x, const float* __restrict__ u, int M, Jobs jobs, int K, int S,
                        int T, int tiles) {
  pdl_launch_dependents();  // the next kernel's CTAs may become resident (they wait for us)
  __shared__ float partial[kWarps][R][MT];
  extern __shared__ float4 act_smem[];  // gated: silu(g)·u of the tile, [MT][K] f32
  const int tile = int(blockIdx.x) % tiles, rb = int(blockIdx.x) / tiles;
  // The CTA's job, by static indices (a dynamic index would copy the parameters to local memory).
  Job job = jobs.job[0];
#pragma unroll
  for (int i = 1; i < kMaxRowJobs; ++i)
    if (i < jobs.count && rb >= jobs.job[i].block_begin) job = jobs.job[i];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slice = warp % S, group = warp / S, groups = kWarps / S;
  const int n_block = (rb - job.block_begin) * groups * R;  // first row of this CTA
  const int n0 = n_block + group * R;
  const int m0 = tile * MT, mt = min(MT, M - m0);
  const int steps = (K + kStep - 1) / kStep;
  const int t_begin = slice * T, t_end = min(t_begin + T, steps);
  float* act = reinterpret_cast<float*>(act_smem);
  // The CTA rows' INT8 scales (1 for the other formats: v·1 = v exactly), read by the epilogue
  // after the barrier: nothing of them stays live in registers through the main loop.
  __shared__ float row_scale[kWarps * R];
  if (threadIdx.x < groups * R)
    row_scale[threadIdx.x] = job.fmt == kInt8 ? __ldg(job.scale + min(n_block + int(threadIdx.x), job.N - 1)) : 1.0f;

  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
  // CTA-uniform: the whole CTA belongs to one job. No early exit: all threads reach the barriers.
  with_format(job.fmt, [&](auto f) {
    if constexpr (kLean)
      warp_rows_lean<decltype(f)::value, MT, R, D, kGated>(job, x, u, act, K, n0, m0, mt, t_begin, t_end, acc);
    else
      warp_rows<decltype(f)::value, MT, R, D, kGated>(job, x, u, act, K, n0, m0, mt, t_begin, t_end, acc);
  });
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) partial[warp][r][m] = v;
    }
  __syncthreads();
  // One thread per (token, row) of the CTA, rows fastest (coalesced y): the slices in order.
  for (int e = threadIdx.x; e < MT * groups * R; e += kThreads) {
    const int m = e / (groups * R), gr = e % (groups * R);
    const int g = gr / R, r = gr % R, n = n_block + gr;
    if (m < mt && n < job.N) {
      float v = partial[g * S][r][m];
      for (int s = 1; s < S; ++s) v = __fadd_rn(v, partial[g * S + s][r][m]);
      v = __fmul_rn(v, row_scale[gr]);  // INT8: the row scale, once
      float* p = job.y + size_t(m0 + m) * size_t(job.N) + n;
      *p = job.accumulate ? __fadd_rn(*p, v) : v;
    }
  }
}

// ---- Token tiles, second form: x in shared memory (row_gemv_f32_tiled_smem_kernel) ---------
// Selected by set_row_gemv_tiled_variant(1 or 2) for every launch that would take
// row_gemv_f32_kernel (M >= 3; gated M >= 2 with a tile of >= 2 tokens); the same bits.
// Layout: as row_gemv_f32_kernel. Parallelisation: a CTA is W = 8 (or 6: tiled_warps)
// warps x R = 4 consecutive rows of one job and one tile of MT tokens; each warp runs ALL of
// K for its rows, the slices one after the other (each slice's lane chains, its xor tree, the slice sums added in
// slice order, +0 for empty trailing slices: the arithmetic of the file header, as
// stream_rows does), so no partial sums meet in shared memory. The W warps walk the K steps
// in lockstep: x of the tile's step t ([MT][512] f32, 16 KB at MT = 8) is copied once per CTA
// into a two-stage ring by 16-byte cp.async (issued one step ahead, one barrier per step) and
// read by every warp (lane L: 16 bytes at 4L + 128i, a warp 512 contiguous bytes:
// conflict-free). Gated: silu(g)·u of the tile for all of K is written to shared memory once
// (fill_act) and read the same way. Weights: each warp keeps one step x R rows of raw weights
// in registers; group i of step t + 1 is requested as soon as group i of step t is converted
// (bf16: after its FMAs), so the next step's loads are in flight while a step computes. FP8: the warp's 4 rows share
// one 128-row scale block (one scale load per step). Why: the first form gives a CTA 8/S x R
// rows (8 at K = 8192) and re-reads the whole x tile from L2 per CTA, with each x load right
// before its FMAs; here a CTA reads it once per 32 (W = 6: 24) rows, from shared memory, one
// step ahead. Shared memory: non-gated 2 x MT x 2 KB (<= 32 KB), gated MT·K·4 <= kGatedSmem:
// no opt-in. Roofline: the weight bytes once, x M·K·4 per CTA (32 or 24 rows) from L2, y; per
// weight and token one fma, per 4 weights and R rows one 16-byte shared-memory x load per
// token (R = 4 balances the shared-memory bandwidth, 128 B per clock per SM, with the FMA rate).
constexpr int kTiledRows = 4;  // rows per warp of the second form

// kFull: the tile holds MT tokens (mt == MT), so the token loop has no exit tests.
template <int F, int MT, int R, int W, bool kGated, bool kFull>
__device__ __forceinline__ void tile_rows_smem(const Job& job, const float* __restrict__ x,
                                               const float* __restrict__ u, float* smem, int K, int n0, int m0,
                                               int mt, int S, int T) {
  static_assert(128 % R == 0, "a warp's rows must share one FP8 scale block");
  static_assert(R * MT <= 32, "one lane keeps each (row, token) sum");
  namespace ac = async_copy;
  constexpr int kElem = F == kBf16 ? 2 : 1;
  constexpr int kStage = MT * kStep;  // floats per x stage
  const int lane = threadIdx.x & 31;
  const int kb = (K + 127) / 128;
  const int steps = (K + kStep - 1) / kStep;
  const bool active = n0 < job.N;  // warp-uniform; inactive warps still copy x and meet the barriers
  const uint8_t* wp[R];            // this lane's first weight byte of each row
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = min(n0 + r, job.N - 1);  // rows past N repeat N - 1 and are not stored
    wp[r] = job.w + size_t(n) * size_t(K) * kElem + 4 * kElem * lane;
  }
  const float* sp = F == kFp8 ? job.scale + size_t(min(n0, job.N - 1) / 128) * kb : nullptr;
  // One step of raw weights per row in registers. Group i of step t + 1 is requested as soon
  // as group i of step t has been converted, so a whole step of compute covers each load.
  StepRaw<F> raw[R];
  float rs = 0.0f;  // FP8: the scale of block 4t + lane % 4 (block_scales' convention)
  auto load_group = [&](int t, int i) {
    if (t * kStep + 128 * i + 4 * lane < K) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = wp[r] + (t * kStep + 128 * i) * kElem;
        if constexpr (F == kBf16) {
          const uint2 v = ld_stream64(p);
          raw[r].v[2 * i] = v.x, raw[r].v[2 * i + 1] = v.y;
        } else {
          raw[r].v[i] = ld_stream32(p);
        }
      }
    }
  };
  auto load_scale = [&](int t) {
    if constexpr (F == kFp8) rs = __ldg(sp + min(4 * t + (lane & 3), kb - 1));
  };
  // Step t of the tile's x into stage t % 2 (whole 16-byte chunks: K % 4 == 0), one commit group.
  auto stage_x = [&](int t) {
    float* st = smem + (t & 1) * kStage;
    const float* xt = x + size_t(m0) * size_t(K) + size_t(t) * kStep;
    const int width = min(kStep, K - t * kStep);
#pragma unroll
    for (int e0 = 0; e0 < MT * (kStep / 4); e0 += W * 32) {
      const int e = e0 + int(threadIdx.x), m = e / (kStep / 4), c = 4 * (e % (kStep / 4));
      if (e < MT * (kStep / 4) && m < mt && c < width) ac::cp_async16(st + m * kStep + c, xt + size_t(m) * K + c);
    }
    ac::cp_async_commit();
  };
  if (active) {  // step 0 in flight while the previous kernel finishes
#pragma unroll
    for (int i = 0; i < 4; ++i) load_group(0, i);
    load_scale(0);
  }
  pdl_wait();  // x, g, u and y may be written or read by earlier kernels; the weights never are
  if constexpr (kGated)
    fill_act<W * 32>(x, u, K, m0, mt, smem);  // every thread: the barrier inside
  else
    stage_x(0);

  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
  float tot = 0.0f;  // lane r·MT + m: the slice sums of (row r, token m)
  bool first = true;
  int left = T;  // steps left in the current slice
  for (int t = 0; t < steps; ++t) {
    if constexpr (!kGated) {
      ac::cp_async_wait<0>();
      __syncthreads();  // step t's x has landed; every warp is done with step t - 1's stage
      if (t + 1 < steps) stage_x(t + 1);
    }
    if (!active) continue;  // warp-uniform; the barriers above are outside
    const bool more = t + 1 < steps;
    const float* xs = (kGated ? smem + t * kStep : smem + (t & 1) * kStage) + 4 * lane;
    const int xstride = kGated ? K : kStep;
    float bs[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) bs[i] = F == kFp8 ? __shfl_sync(0xffffffffu, rs, i) : 1.0f;
    if (more) load_scale(t + 1);
    const int kbase = t * kStep + 4 * lane;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (kbase + 128 * i >= K) break;  // per lane (K % 512 != 0: the last step, no refill)
      float w[R][4];
#pragma unroll
      for (int r = 0; r < R; ++r) convert_group<F>(raw[r], i, bs[i], w[r]);
      // Group i's registers are free again. bf16 (twice the registers) refills after the
      // group's FMAs, so that its raw group and the converted weights are not live together.
      if (F != kBf16 && more) load_group(t + 1, i);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (!kFull && m >= mt) break;
        const float4 a = *reinterpret_cast<const float4*>(xs + m * xstride + 128 * i);
        const float xv[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[r][m] = fmaf(w[r][j], xv[j], acc[r][m]);
      }
      if (F == kBf16 && more) load_group(t + 1, i);
    }
    if (--left == 0 || !more) {  // end of a slice (warp-uniform)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float v = acc[r][m];
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          if (lane == r * MT + m) tot = first ? v : __fadd_rn(tot, v);
          acc[r][m] = 0.0f;
        }
      first = false;
      left = T;
    }
  }
  if (!active || lane >= R * MT) return;  // no barrier below
  const int r = lane / MT, m = lane % MT, n = n0 + r;
  if (m >= mt || n >= job.N) return;
  // Slices past the last step add their +0 sums, as in the first form (x + 0 differs from x
  // only for x = -0), then the INT8 row scale (once), then y (= or +=).
  if ((steps + T - 1) / T < S) tot = __fadd_rn(tot, 0.0f);
  const float v = F == kInt8 ? __fmul_rn(tot, __ldg(job.scale + n)) : tot;
  float* p = job.y + size_t(m0 + m) * size_t(job.N) + n;
  *p = job.accumulate ? __fadd_rn(*p, v) : v;
}

// W warps per CTA (8, or 6 where fewer rows per CTA balance a short launch over the SMs).
template <int MT, bool kGated, int W>
__global__ void __launch_bounds__(W * 32, 2)
    row_gemv_f32_tiled_smem_kernel(const float* __restrict__ x, const float* __restrict__ u, int M, Jobs jobs, int K,
                                   int S, int T, int tiles) {
  pdl_launch_dependents();
  extern __shared__ float4 tiled_smem_f4[];  // the x ring [2][MT][512] f32, or (gated) silu(g)·u [MT][K]
  const int tile = int(blockIdx.x) % tiles, rb = int(blockIdx.x) / tiles;
  Job job = jobs.job[0];  // static indices (a dynamic index would copy the parameters to local memory)
#pragma unroll
  for (int i = 1; i < kMaxRowJobs; ++i)
    if (i < jobs.count && rb >= jobs.job[i].block_begin) job = jobs.job[i];
  constexpr int R = kTiledRows;
  const int warp = threadIdx.x >> 5;
  const int n0 = ((rb - job.block_begin) * W + warp) * R;
  const int m0 = tile * MT, mt = min(MT, M - m0);
  float* smem = reinterpret_cast<float*>(tiled_smem_f4);
  const bool full = mt == MT;  // CTA-uniform: a full tile needs no per-token tests
  with_format(job.fmt, [&](auto f) {
    constexpr int F = decltype(f)::value;
    if (full)
      tile_rows_smem<F, MT, R, W, kGated, true>(job, x, u, smem, K, n0, m0, mt, S, T);
    else
      tile_rows_smem<F, MT, R, W, kGated, false>(job, x, u, smem, K, n0, m0, mt, S, T);
  });
}

// ---- One or two tokens: streaming warps (row_gemv_f32_stream_kernel) ----------------------
// A warp owns R consecutive rows of one job over ALL of K: it runs the S slices one after the
// other (each slice's lane chains, then its xor shuffle tree, then slice sums added in slice
// order: the arithmetic above, bit for bit), so there are no partial sums in shared memory and
// no barrier (except the gated fill). Its weights stream through a ring of D steps x R rows:
// step t + D is requested as soon as step t is consumed, so each warp keeps about D·R·512 B
// (FP8/INT8) in flight from its first to its last step (the slice-per-warp kernel issues
// everything at once, then computes with nothing in flight, then meets at a barrier). FP8: the
// R rows of a warp lie in one 128-row scale block (R | 128, first row a multiple of R), so one
// scale load per step serves them all. Two feeds of the ring (RowGemvFeed, ops_quant_gemv.h),
// the same arithmetic (step_fma, slice_sum, store_rows below are shared):
//   Registers (stream_rows): the ring is registers; a lane loads its own 4-byte groups
//     (FP8/INT8: one 128-byte line per warp instruction; bf16 8-byte loads), 4·R loads in
//     flight per step.
//   Lean (stream_rows_lean, K % 512 == 0): the same ring with lean addressing (below).
// Shared memory of a CTA (dynamic): gated only, the tile's silu(g)·u [MT][K] f32 (<= kGatedSmem,
// no opt-in).

// One step of one lane: its 4 groups k = kbase + 128i of its R rows, times the tile's tokens,
// into its fma chains acc[r][m] (every lane of the warp calls this: the scale shuffles).
// kWhole: every step is whole (K % 512 == 0): no per-lane k < K tests (the lean feed passes xt
// already at the step and lane, kbase 0, so the x offsets are immediates).
template <int F, int MT, int R, bool kGated, bool kWhole = false>
__device__ __forceinline__ void step_fma(const StepRaw<F> (&raw)[R], float rs, const float* __restrict__ xt, int K,
                                         int mt, int kbase, float (&acc)[R][MT]) {
  float bs[4];  // FP8: the step's 4 block scales (every lane shuffles)
#pragma unroll
  for (int i = 0; i < 4; ++i) bs[i] = F == kFp8 ? __shfl_sync(0xffffffffu, rs, i) : 1.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k = kbase + 128 * i;
    if (!kWhole && k >= K) break;  // per lane (K % 512 != 0)
    float w[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) convert_group<F>(raw[r], i, bs[i], w[r]);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m >= mt) break;
      float xv[4];
      load_x4<kGated>(xt, size_t(m) * K + k, xv);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[r][m] = fmaf(w[r][j], xv[j], acc[r][m]);
    }
  }
}

// End of a slice (warp-uniform): each chain's xor shuffle tree, added to the slice sums in order.
template <int MT, int R>
__device__ __forceinline__ void slice_sum(float (&acc)[R][MT], float (&tot)[R][MT], bool first) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      tot[r][m] = first ? v : __fadd_rn(tot[r][m], v);
      acc[r][m] = 0.0f;
    }
}

// The empty slices' +0, the INT8 row scale, and y (= or +=).
template <int F, int MT, int R>
__device__ __forceinline__ void store_rows(const Job& job, float (&tot)[R][MT], const float (&row_scale)[R], int n0,
                                           int m0, int mt, int steps, int S, int T) {
  const int lane = threadIdx.x & 31;
  // Slices past the last step (S·T > steps by a whole slice): the slice-per-warp kernel adds
  // their +0 sums; so does this (x + 0 differs from x only for x = -0).
  if ((steps + T - 1) / T < S) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) tot[r][m] = __fadd_rn(tot[r][m], 0.0f);
  }
  // Every lane holds the same sums (the xor tree is symmetric); lane r·MT + m stores (r, m).
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int n = n0 + r;
      if (lane == r * MT + m && m < mt && n < job.N) {
        const float v = F == kInt8 ? __fmul_rn(tot[r][m], row_scale[r]) : tot[r][m];  // the row scale, once
        float* p = job.y + size_t(m0 + m) * size_t(job.N) + n;
        *p = job.accumulate ? __fadd_rn(*p, v) : v;
      }
    }
}

// The feeds (host and device): RowGemvFeed's values.
enum : int { kFeedRegisters = 0, kFeedLean = 1 };

template <int F, int MT, int R, int kD, bool kGated>
__device__ __forceinline__ void stream_rows(const Job& job, const float* __restrict__ x, const float* __restrict__ u,
                                            float* act, int K, int n0, int m0, int mt, int S, int T) {
  static_assert(128 % R == 0, "a warp's rows must share one FP8 scale block");
  constexpr size_t kElem = F == kBf16 ? 2 : 1;
  constexpr int D = F == kBf16 && kD > 1 ? kD / 2 : kD;  // the same bytes in flight
  const int lane = threadIdx.x & 31;
  const int kb = (K + 127) / 128;
  const int steps = (K + kStep - 1) / kStep;
  const bool active = n0 < job.N;  // warp-uniform; inactive warps only help the gated fill
  const uint8_t* rows[R];
  float row_scale[R];  // INT8: multiplies the finished sum
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = min(n0 + r, job.N - 1);  // rows past N repeat N - 1 and are not stored
    rows[r] = job.w + size_t(n) * size_t(K) * kElem;
    row_scale[r] = F == kInt8 ? __ldg(job.scale + n) : 1.0f;
  }
  const float* srow = F == kFp8 ? job.scale + size_t(min(n0, job.N - 1) / 128) * kb : nullptr;
  StepRaw<F> raw[D][R];  // the ring (raw[.][.].s unused: rs holds the step's scale)
  float rs[D];           // FP8: the scale of block 4t + lane % 4 (block_scales' convention)
  auto load = [&](int t, StepRaw<F>(&slot)[R], float& s) {
#pragma unroll
    for (int r = 0; r < R; ++r) load_step_w<F>(rows[r], K, t, slot[r]);
    if constexpr (F == kFp8) s = __ldg(srow + min(4 * t + (lane & 3), kb - 1));
  };
  if (active) {
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (d < steps) load(d, raw[d], rs[d]);  // in flight while the previous kernel finishes
  }
  pdl_wait();  // x, g, u and y may be written or read by earlier kernels; the weights never are
  const float* xt;
  if constexpr (kGated) {
    fill_act(x, u, K, m0, mt, act);  // every thread of the CTA: the barrier inside
    xt = act;
  } else {
    xt = x + size_t(m0) * K;
  }
  if (!active) return;  // no barrier below

  float acc[R][MT], tot[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f, tot[r][m] = 0.0f;
  bool first = true;   // the first slice's sum is taken as is, the next ones added in order
  int left = T;        // steps left in the current slice
  for (int t0 = 0; t0 < steps; t0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int t = t0 + d;
      if (t >= steps) break;  // warp-uniform
      step_fma<F, MT, R, kGated>(raw[d], F == kFp8 ? rs[d] : 0.0f, xt, K, mt, t * kStep + 4 * lane, acc);
      if (t + D < steps) load(t + D, raw[d], rs[d]);  // refill the slot just consumed
      if (--left == 0 || t + 1 == steps) {           // end of a slice (warp-uniform)
        slice_sum<MT, R>(acc, tot, first);
        first = false;
        left = T;
      }
    }
  }
  store_rows<F, MT, R>(job, tot, row_scale, n0, m0, mt, steps, S, T);
}

// The same warp work as stream_rows when every step is whole (K % 512 == 0: no per-lane k < K
// tests) with lean addressing: each row keeps a running pointer to its next step (one 64-bit add
// per row and step) and the 4 groups are immediate offsets from it; x likewise (one add per
// step); the FP8 scale pointer advances by 4 blocks per step. The compiled inner loop per group
// of 4 weights and row is then the arithmetic alone (FP8: 2 e4m3x2 -> f16x2 conversions, 4
// f16 -> f32, 4 scale products, 4 FMAs; INT8: 4 byte permutes, 4 subtracts, 4 FMAs) plus one x
// load shared by the R rows: at batch 1 these kernels are issue-bound (ncu: ~10 instructions per
// weight in stream_rows at R = 1, most of them 64-bit address arithmetic and bounds tests), so
// fewer instructions per weight is what brings them to the bandwidth. Bits: identical to
// stream_rows (same chains, same order, same trees).
template <int F, int MT, int R, int kD, bool kGated>
__device__ __forceinline__ void stream_rows_lean(const Job& job, const float* __restrict__ x,
                                                 const float* __restrict__ u, float* act, int K, int n0, int m0,
                                                 int mt, int S, int T, bool early) {
  static_assert(128 % R == 0, "a warp's rows must share one FP8 scale block");
  constexpr int kElem = F == kBf16 ? 2 : 1;
  constexpr int D = F == kBf16 && kD > 1 ? kD / 2 : kD;  // the same bytes in flight
  constexpr int kGroupBytes = 128 * kElem;                // a lane's group i -> i + 1 in a row
  constexpr int kStepBytes = kStep * kElem;
  const int lane = threadIdx.x & 31;
  const int steps = K / kStep;  // K % 512 == 0
  const bool active = n0 < job.N;
  const uint8_t* wp[R];  // each row's next step to load, at this lane's first group
  float row_scale[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = min(n0 + r, job.N - 1);  // rows past N repeat N - 1 and are not stored
    wp[r] = job.w + size_t(n) * size_t(K) * kElem + 4 * kElem * lane;
    row_scale[r] = F == kInt8 ? __ldg(job.scale + n) : 1.0f;
  }
  // FP8: lane loads the scale of block 4t + lane % 4 (K % 512 == 0: always inside the row).
  const float* sp = F == kFp8 ? job.scale + size_t(min(n0, job.N - 1) / 128) * size_t(K / 128) + (lane & 3) : nullptr;
  StepRaw<F> raw[D][R];
  float rs[D];
  auto load = [&](StepRaw<F>(&slot)[R], float& sc) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (F == kBf16) {
          const uint2 p = ld_stream64(wp[r] + i * kGroupBytes);
          slot[r].v[2 * i] = p.x, slot[r].v[2 * i + 1] = p.y;
        } else {
          slot[r].v[i] = ld_stream32(wp[r] + i * kGroupBytes);
        }
      }
      wp[r] += kStepBytes;
    }
    if constexpr (F == kFp8) {
      sc = __ldg(sp);
      sp += 4;
    }
  };
  if (active && early) {
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (d < steps) load(raw[d], rs[d]);  // in flight while the previous kernel finishes
  }
  pdl_wait();  // x, g, u and y may be written or read by earlier kernels; the weights never are
  if (active && !early) {
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (d < steps) load(raw[d], rs[d]);
  }
  const float* xt;
  if constexpr (kGated) {
    fill_act(x, u, K, m0, mt, act);  // every thread of the CTA: the barrier inside
    xt = act;
  } else {
    xt = x + size_t(m0) * K;
  }
  if (!active) return;  // no barrier below

  const float* xs = xt + 4 * lane;  // this step's x at the lane's first group, token 0
  float acc[R][MT], tot[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f, tot[r][m] = 0.0f;
  bool first = true;
  int left = T;
  for (int t0 = 0; t0 < steps; t0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int t = t0 + d;
      if (t >= steps) break;  // warp-uniform
      step_fma<F, MT, R, kGated, true>(raw[d], F == kFp8 ? rs[d] : 0.0f, xs, K, mt, 0, acc);
      xs += kStep;
      if (t + D < steps) load(raw[d], rs[d]);  // refill the slot just consumed (step t + D)
      if (--left == 0 || t + 1 == steps) {      // end of a slice (warp-uniform)
        slice_sum<MT, R>(acc, tot, first);
        first = false;
        left = T;
      }
    }
  }
  store_rows<F, MT, R>(job, tot, row_scale, n0, m0, mt, steps, S, T);
}

// CTAs per SM the registers are budgeted for: 3 (80 per thread) for one row per warp, 2 for
// four (launch_small_m).
template <int R>
inline constexpr int kStreamMinBlocks = R == 1 ? 3 : 2;

template <int MT, int R, int D, bool kGated, int kFeed, int kBlocks = kStreamMinBlocks<R>>
__global__ void __launch_bounds__(kThreads, kBlocks)
    row_gemv_f32_stream_kernel(const float* __restrict__ x, const float* __restrict__ u, int M, Jobs jobs, int K,
                               int S, int T, int tiles) {
  pdl_launch_dependents();
  extern __shared__ float4 stream_smem_f4[];  // gated: the tile's silu(g)·u [MT][K] f32
  const int tile = int(blockIdx.x) % tiles, rb = int(blockIdx.x) / tiles;
  Job job = jobs.job[0];
#pragma unroll
  for (int i = 1; i < kMaxRowJobs; ++i)
    if (i < jobs.count && rb >= jobs.job[i].block_begin) job = jobs.job[i];
  const int warp = threadIdx.x >> 5;
  const int n0 = ((rb - job.block_begin) * kWarps + warp) * R;
  const int m0 = tile * MT, mt = min(MT, M - m0);
  float* act = reinterpret_cast<float*>(stream_smem_f4);
  with_format(job.fmt, [&](auto f) {
    constexpr int F = decltype(f)::value;
    if constexpr (kFeed == kFeedLean)
      stream_rows_lean<F, MT, R, D, kGated>(job, x, u, act, K, n0, m0, mt, S, T, jobs.early_loads != 0);
    else
      stream_rows<F, MT, R, D, kGated>(job, x, u, act, K, n0, m0, mt, S, T);
  });
}

int sm_count() { return current_device_sm_count(); }

int device_major() {
  static const int major = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev);
    return v;
  }();
  return major;
}

// Numbers the jobs' row blocks consecutively (each job's first block) and returns the 1-D grid:
// row blocks x token tiles.
unsigned grid_blocks(Jobs& jobs, int rows_per_block, int tiles) {
  long long blocks = 0;
  for (int i = 0; i < jobs.count; ++i) {
    jobs.job[i].block_begin = int(blocks);
    blocks += (jobs.job[i].N + rows_per_block - 1) / rows_per_block;
  }
  if (blocks * tiles > INT_MAX) throw Error("row_gemv_f32: launch grid too large");
  return unsigned(blocks * tiles);
}

template <int MT, int R, int D, bool kGated>
void launch_variant(const float* x, const float* u, int M, Jobs jobs, int K, cudaStream_t stream) {
  const KSplit ks = k_split(K);
  const int tiles = (M + MT - 1) / MT;
  const unsigned grid = grid_blocks(jobs, (kWarps / ks.S) * R, tiles);
  const size_t smem = kGated ? size_t(MT) * size_t(K) * sizeof(float) : 0;  // <= kGatedSmem
  // Programmatic dependent launch for generated-token row counts (pdl.cuh): the CTAs that fit
  // start their weight loads while the previous kernel finishes.
  // Lean addressing (warp_rows_lean) with the lean feed when every step is whole; same bits.
  if (K % kStep == 0 && row_gemv_feed() == RowGemvFeed::Lean)
    launch_pdl(M <= kPdlMaxRows, row_gemv_f32_kernel<MT, R, D, kGated, true>, dim3(grid), dim3(kThreads), smem, stream,
               x, u, M, jobs, K, ks.S, ks.T, tiles);
  else
    launch_pdl(M <= kPdlMaxRows, row_gemv_f32_kernel<MT, R, D, kGated, false>, dim3(grid), dim3(kThreads), smem,
               stream, x, u, M, jobs, K, ks.S, ks.T, tiles);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

// Warps per CTA of the second form: 8, or 6 when that spreads the launch more evenly over the
// SMs. Each SM issues for about ceil(CTAs / SMs) x W warps of work: o_proj 3072 x 8192 at one
// tile is 96 CTAs of 8 warps (36 of 132 SMs idle) or 128 of 6. Ties keep 8 (more warps per SM
// hide more latency). The bits do not depend on W (every warp sums whole rows).
int tiled_warps(const Jobs& jobs, int tiles) {
  int best = 8;
  long long best_cost = LLONG_MAX;
  for (int w : {8, 6}) {
    long long blocks = 0;
    for (int i = 0; i < jobs.count; ++i) blocks += (jobs.job[i].N + w * kTiledRows - 1) / (w * kTiledRows);
    const long long cost = (blocks * tiles + sm_count() - 1) / sm_count() * w;
    if (cost < best_cost) best_cost = cost, best = w;
  }
  return best;
}

// The second form of the token tiles (row_gemv_f32_tiled_smem_kernel): W warps x 4 rows per
// CTA, tiles of MT tokens; x through a two-stage shared-memory ring (gated: silu(g)·u, all of
// K). W by tiled_warps (variant 1) or 8 (variant 2).
template <int MT, bool kGated, int W>
void launch_tiled_smem_w(const float* x, const float* u, int M, Jobs jobs, int K, cudaStream_t stream) {
  const KSplit ks = k_split(K);
  const int tiles = (M + MT - 1) / MT;
  const unsigned grid = grid_blocks(jobs, W * kTiledRows, tiles);
  const size_t smem = kGated ? size_t(MT) * size_t(K) * sizeof(float)    // <= kGatedSmem (launch checks)
                             : size_t(2) * MT * kStep * sizeof(float);  // <= 32 KB
  launch_pdl(M <= kPdlMaxRows, row_gemv_f32_tiled_smem_kernel<MT, kGated, W>, dim3(grid), dim3(W * 32), smem, stream,
             x, u, M, jobs, K, ks.S, ks.T, tiles);
  MOESERVE_CUDA_CHECK_LAUNCH();
}
template <int MT, bool kGated>
void launch_tiled_smem(const float* x, const float* u, int M, const Jobs& jobs, int K, int variant,
                       cudaStream_t stream) {
  if (variant == 1 && tiled_warps(jobs, (M + MT - 1) / MT) == 6)
    launch_tiled_smem_w<MT, kGated, 6>(x, u, M, jobs, K, stream);
  else
    launch_tiled_smem_w<MT, kGated, 8>(x, u, M, jobs, K, stream);
}

std::atomic<int> g_early_loads{1};  // set_row_gemv_early_loads

// The streaming kernel: 8 warps x R rows per CTA, one tile of MT (= M) tokens, ring depth D.
template <int MT, int R, int D, bool kGated, int kFeed = kFeedRegisters, int kBlocks = kStreamMinBlocks<R>>
void launch_stream(const float* x, const float* u, int M, Jobs jobs, int K, cudaStream_t stream) {
  jobs.early_loads = g_early_loads.load(std::memory_order_relaxed);
  const KSplit ks = k_split(K);
  const int tiles = (M + MT - 1) / MT;
  const unsigned grid = grid_blocks(jobs, kWarps * R, tiles);
  const size_t smem = kGated ? size_t(MT) * size_t(K) * sizeof(float) : 0;  // <= kGatedSmem
  launch_pdl(M <= kPdlMaxRows, row_gemv_f32_stream_kernel<MT, R, D, kGated, kFeed, kBlocks>, dim3(grid),
             dim3(kThreads), smem, stream, x, u, M, jobs, K, ks.S, ks.T, tiles);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

// The feed a streaming launch takes: Lean where it is selected and every step is whole
// (K % 512 == 0), otherwise Registers.
int requested_feed(int K) {
  return row_gemv_feed() == RowGemvFeed::Lean && K % kStep == 0 ? kFeedLean : kFeedRegisters;
}

// One streaming configuration (MT, R, kGated) in its two feeds: Lean with DL slots, Registers
// with DR.
template <int MT, int R, bool kGated, int DR, int DL>
void launch_stream_feed(int feed, const float* x, const float* u, int M, const Jobs& jobs, int K,
                        cudaStream_t stream) {
  if (feed == kFeedLean) return launch_stream<MT, R, DL, kGated, kFeedLean>(x, u, M, jobs, K, stream);
  launch_stream<MT, R, DR, kGated, kFeedRegisters>(x, u, M, jobs, K, stream);
}

// M <= 2: rows per warp by the launch's rows. 4 rows per warp when that still gives a full
// wave of warps (16 per SM): tall matrices (the LM head, q_proj, in_proj) read x once per 4 rows.
// Otherwise 1 row per warp (3 CTAs per SM): short, long-K matrices (o_proj, out_proj: 3072 x
// 8192 -> 384 CTAs, one wave) and the router set get the most warps and loads in flight. Ring
// depth D (FP8/INT8 steps; bf16 half as many slots of twice the bytes) and CTAs per SM:
//                                    Registers        Lean
//   4 rows, one token (Wide)         3, 2 per SM      1, 3 per SM (80 registers)
//   4 rows, one token (Shape)        3, 2 per SM      2, 2 per SM (128 registers)
//   2 rows, two tokens (Wide)        2, 2 per SM      2, 3 per SM (80 registers)
//   4 rows, two tokens (Shape)       2, 2 per SM      2, 2 per SM
//   4 rows, gated                    3, 2 per SM      2, 2 per SM
//   1 row,  M <= 2                   8 (M = 1), 4     4, 3 per SM
//   1 row,  gated                    4                4, 3 per SM
//
// Why one token takes a one-step ring at 3 CTAs per SM (RowGemvRows::Wide, docs/PERF.md run
// S22-2): at one token a warp is bound by its own chain (ncu, in_proj at 2 CTAs per SM: 34% of
// the stall samples wait for a weight load, 36% for the issue slot another warp took, 5.6 cycles
// between a warp's instructions, the SMs busy 78% of the time), so a launch takes (rounds of
// CTAs) x (one CTA's time) whatever the bytes: in_proj's 644 CTAs of 32 rows were 2.44 waves of
// 264 = 3 rounds (23.1 us, against q_proj's 2 rounds of 512 CTAs in 14.8 us). With 80 registers
// 3 CTAs fit per SM (24 warps): in_proj is 1.63 waves = 2 rounds (19.0 us), the LM head 19.6
// waves instead of 29.4 (190 us instead of 216), and a batch-1 step 3.71-3.73 ms instead of
// 3.94-3.95. A two-step ring at 3 per SM spills a little and is slower (20.1 / 197 us); 2 rows per
// warp (more, shorter rounds) lost to it too. Two tokens (batch 2, or a sequence and its MTP draft):
// 4 rows with a one-step ring spill at 80 registers, 2 rows with a two-step ring do not; at 3 per
// SM they take a batch-2 step from 6.61-6.64 ms to 6.32 (run S22-5).
std::atomic<int> g_row_gemv_rows{int(RowGemvRows::Wide)};

struct StreamShape {
  int rows_per_warp, ctas_per_sm, depth;
};
// The shape a streaming launch takes (the launch below follows it; tests read it).
StreamShape stream_shape(const Jobs& jobs, int MT, bool gated, int feed) {
  long long rows = 0;
  for (int i = 0; i < jobs.count; ++i) rows += jobs.job[i].N;
  const bool lean = feed == kFeedLean;
  if (rows < 4LL * 16 * sm_count()) return {1, 3, lean ? 4 : (MT == 1 && !gated ? 8 : 4)};
  if (!gated && lean && g_row_gemv_rows.load(std::memory_order_relaxed) == int(RowGemvRows::Wide))
    return MT == 1 ? StreamShape{4, 3, 1} : StreamShape{2, 3, 2};
  return {4, 2, lean ? 2 : (MT == 1 ? 3 : 2)};
}

template <int MT, bool kGated>
void launch_small_m(const float* x, const float* u, int M, const Jobs& jobs, int K, cudaStream_t stream) {
  const int feed = requested_feed(K);
  const StreamShape sh = stream_shape(jobs, MT, kGated, feed);
  if constexpr (MT == 1 && !kGated) {
    if (sh.ctas_per_sm == 3 && sh.rows_per_warp == 4)
      return launch_stream<1, 4, 1, false, kFeedLean, 3>(x, u, M, jobs, K, stream);
  }
  if constexpr (MT == 2 && !kGated) {
    if (sh.ctas_per_sm == 3 && sh.rows_per_warp == 2)
      return launch_stream<2, 2, 2, false, kFeedLean, 3>(x, u, M, jobs, K, stream);
  }
  if (sh.rows_per_warp == 4)
    return launch_stream_feed<MT, 4, kGated, MT == 1 ? 3 : 2, 2>(feed, x, u, M, jobs, K, stream);
  launch_stream_feed<MT, 1, kGated, MT == 1 && !kGated ? 8 : 4, 4>(feed, x, u, M, jobs, K, stream);
}

// Measurement override of the one-token kernel (set_row_gemv_one_token_variant): 0 = by shape.
int g_one_token_variant = 0;
// The token-tile kernel's form (set_row_gemv_tiled_variant): 0 = row_gemv_f32_kernel, 1 =
// row_gemv_f32_tiled_smem_kernel (warps per CTA by tiled_warps), 2 = the same with 8 warps
// always. Read at launch time (a captured graph keeps its form).
std::atomic<int> g_tiled_variant{2};

// (MT, R, D) by M and by the launch's rows. Every variant computes each output identically.
void launch(const float* x, const float* u, int M, const Jobs& jobs, int K, cudaStream_t stream) {
  if (!u && M == 1 && g_one_token_variant != 0 && (g_one_token_variant < 9 || K % kStep == 0)) {
    switch (g_one_token_variant) {
      case 1: launch_stream<1, 1, 8, false>(x, u, M, jobs, K, stream); return;
      case 2: launch_stream<1, 4, 3, false>(x, u, M, jobs, K, stream); return;
      case 3: launch_variant<1, 4, 4, false>(x, u, M, jobs, K, stream); return;
      case 4: launch_variant<1, 2, 4, false>(x, u, M, jobs, K, stream); return;
      case 5: launch_variant<1, 1, 4, false>(x, u, M, jobs, K, stream); return;
      case 6: launch_stream<1, 2, 6, false>(x, u, M, jobs, K, stream); return;
      case 9: launch_stream<1, 1, 8, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 10: launch_stream<1, 2, 6, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 11: launch_stream<1, 4, 3, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 12: launch_stream<1, 2, 4, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 13: launch_stream<1, 1, 4, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 14: launch_stream<1, 4, 2, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 15: launch_stream<1, 1, 2, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 16: launch_stream<1, 2, 2, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 17: launch_stream<1, 4, 1, false, kFeedLean>(x, u, M, jobs, K, stream); return;
      case 18: launch_stream<1, 4, 1, false, kFeedLean, 3>(x, u, M, jobs, K, stream); return;
      case 7: launch_variant<1, 4, 2, false>(x, u, M, jobs, K, stream); return;
      case 8: launch_variant<1, 2, 8, false>(x, u, M, jobs, K, stream); return;
      default: break;
    }
  }
  // The second form of the token tiles stages x with cp.async (sm_80+); older devices keep the first.
  const int tv = g_tiled_variant.load(std::memory_order_relaxed);
  const bool smem_tiles = tv != 0 && device_major() >= 8;
  if (u) {  // gated: the tile's silu(g)·u in shared memory, MT·K·4 <= kGatedSmem bytes
    const size_t row_bytes = size_t(K) * sizeof(float);
    if (M == 1 || 2 * row_bytes > kGatedSmem) launch_small_m<1, true>(x, u, M, jobs, K, stream);
    else if (smem_tiles && (M == 2 || 4 * row_bytes > kGatedSmem)) launch_tiled_smem<2, true>(x, u, M, jobs, K, tv, stream);
    else if (smem_tiles && (M <= 4 || 8 * row_bytes > kGatedSmem)) launch_tiled_smem<4, true>(x, u, M, jobs, K, tv, stream);
    else if (smem_tiles) launch_tiled_smem<8, true>(x, u, M, jobs, K, tv, stream);
    else if (M == 2 || 4 * row_bytes > kGatedSmem) launch_variant<2, 2, 4, true>(x, u, M, jobs, K, stream);
    else if (M <= 4 || 8 * row_bytes > kGatedSmem) launch_variant<4, 2, 4, true>(x, u, M, jobs, K, stream);
    else launch_variant<8, 4, 1, true>(x, u, M, jobs, K, stream);
    return;
  }
  if (M == 1) {
    launch_small_m<1, false>(x, u, M, jobs, K, stream);
  } else if (M == 2) {
    launch_small_m<2, false>(x, u, M, jobs, K, stream);
  } else if (smem_tiles) {
    if (M <= 4) launch_tiled_smem<4, false>(x, u, M, jobs, K, tv, stream);
    else launch_tiled_smem<8, false>(x, u, M, jobs, K, tv, stream);
  } else if (M <= 4) {
    launch_variant<4, 2, 4, false>(x, u, M, jobs, K, stream);
  } else {
    launch_variant<8, 4, 1, false>(x, u, M, jobs, K, stream);
  }
}

Job make_job(const RowGemvJob& j) {
  const DeviceLinear& w = *j.w;
  const int f = fmt_of(w);
  const uint8_t* bytes = f == kFp8    ? w.fp8.data()
                         : f == kInt8 ? reinterpret_cast<const uint8_t*>(w.int8.data())
                                      : reinterpret_cast<const uint8_t*>(w.dense.data());
  return Job{bytes, f == kBf16 ? nullptr : w.scale.data(), j.y, int(w.N), f, 0, j.accumulate ? 1 : 0};
}

std::atomic<int> g_row_gemv_feed{int(RowGemvFeed::Lean)};

}  // namespace

void set_row_gemv_one_token_variant(int v) { g_one_token_variant = v; }
void set_row_gemv_early_loads(bool early) { g_early_loads.store(early ? 1 : 0, std::memory_order_relaxed); }
void set_row_gemv_tiled_variant(int v) {
  if (v < 0 || v > 2)
    throw Error("set_row_gemv_tiled_variant: 0 (x through L1), 1 (x in shared memory), 2 (1 with 8 warps per CTA)");
  g_tiled_variant.store(v, std::memory_order_relaxed);
}
int row_gemv_tiled_variant() { return g_tiled_variant.load(std::memory_order_relaxed); }
RowGemvStreamShape row_gemv_stream_shape(std::span<const int64_t> job_rows, int M, int K) {
  if (M < 1 || M > 2) throw Error("row_gemv_stream_shape: the streaming kernel serves M = 1 or 2");
  Jobs js{};
  js.count = int(std::min(job_rows.size(), size_t(kMaxRowJobs)));
  for (int i = 0; i < js.count; ++i) js.job[i].N = int(job_rows[size_t(i)]);
  const StreamShape s = stream_shape(js, M, false, requested_feed(K));
  return {s.rows_per_warp, s.ctas_per_sm, s.depth};
}
void set_row_gemv_rows(RowGemvRows rows) { g_row_gemv_rows.store(int(rows), std::memory_order_relaxed); }
RowGemvRows parse_row_gemv_rows(const std::string& name) {
  if (name == "wide") return RowGemvRows::Wide;
  if (name == "shape") return RowGemvRows::Shape;
  throw Error("unknown row GEMV one-token form '" + name + "' (wide, shape)");
}
void set_row_gemv_feed(RowGemvFeed feed) { g_row_gemv_feed.store(int(feed), std::memory_order_relaxed); }
RowGemvFeed parse_row_gemv_feed(const std::string& name) {
  if (name == "registers") return RowGemvFeed::Registers;
  if (name == "lean") return RowGemvFeed::Lean;
  if (name == "cp-async" || name == "bulk")
    throw Error("row GEMV feed '" + name + "' no longer exists (removed: the same bits, no faster; docs/PERF.md run S5); "
                "the feeds are registers and lean");
  throw Error("unknown row GEMV feed '" + name + "' (registers, lean)");
}
RowGemvFeed row_gemv_feed() { return RowGemvFeed(g_row_gemv_feed.load(std::memory_order_relaxed)); }

bool row_gemv_supported(const DeviceLinear& w) {
  if (w.N <= 0 || w.K <= 0 || w.K % 4 != 0 || w.N > INT_MAX / 2 || w.K > INT_MAX / 2) return false;
  const size_t nk = size_t(w.N) * size_t(w.K);
  switch (w.format) {
    case quant::WeightFormat::Fp8Block:
      return w.fp8.size() == nk;
    case quant::WeightFormat::Int8Rowwise:
      return w.int8.size() == nk;
    case quant::WeightFormat::Dense:
    case quant::WeightFormat::Nvfp4:
      return w.dense.size() == nk;
    default:
      return false;
  }
}

bool row_gemv_gated_supported(const DeviceLinear& w) {
  return row_gemv_supported(w) && size_t(w.K) * sizeof(float) <= kGatedSmem;
}

void row_gemv_f32(const float* x, int M, std::span<const RowGemvJob> jobs, cudaStream_t stream) {
  if (M == 0 || jobs.empty()) return;
  const int64_t K = jobs[0].w->K;
  for (const auto& j : jobs)
    if (!row_gemv_supported(*j.w) || j.w->K != K)
      throw Error("row_gemv_f32: every job needs an FP8 / INT8 / bf16 weight with the same K, K % 4 == 0");
  for (size_t b = 0; b < jobs.size(); b += kMaxRowJobs) {  // more than kMaxRowJobs: several launches
    Jobs js{};
    js.count = int(std::min(jobs.size() - b, size_t(kMaxRowJobs)));
    for (int i = 0; i < js.count; ++i) js.job[i] = make_job(jobs[b + size_t(i)]);
    launch(x, nullptr, M, js, int(K), stream);
  }
}

void row_gemv_f32_gated(const float* g, const float* u, int M, const DeviceLinear& w, float* y, bool accumulate,
                        cudaStream_t stream) {
  if (M == 0) return;
  if (!row_gemv_gated_supported(w))
    throw Error("row_gemv_f32_gated: needs an FP8 / INT8 / bf16 weight with K % 4 == 0, K <= 11776");
  Jobs js{};
  js.count = 1;
  js.job[0] = make_job(RowGemvJob{&w, y, accumulate});
  launch(g, u, M, js, int(w.K), stream);
}

}  // namespace moeserve::cuda
