// tc_gemv_f32 / tc_gemv_f32_gated (ops_tc_gemv.h): generated tokens' dense projections on
// mma.sync. The arithmetic (block-128 P scaling, f16 hi/lo split, k permutation, slices) is in
// the header; every kernel form here computes exactly it. The launcher (launch below) hands the
// 9-256-token launches to the wgmma form on sm_90 GPUs (ops_tc_gemv_wgmma.h), with this file's
// planes workspace; ops_tc_gemv_piece.cuh holds what both files' kernels share.
//
// Layout. x f32 [M, K] (gated: g, u), 16-byte aligned rows (K % 16 == 0). W [N, K] row-major:
// FP8 e4m3 with f32 block scales [ceil(N/128), B], INT8 with f32 row scales [N], or bf16. y f32
// [M, N].
//
// Parallelisation. A CTA is 8 warps; it owns 16·8/WS consecutive rows of one job (a job's rows
// are cut into such row blocks; CTAs of several jobs form one 1-D grid) and one token tile of
// MT = 8·NT tokens (NT = 1, 2, 4 n8 column blocks; grid = row blocks x tiles, the tiles of one
// row block adjacent so that the later ones read the weights from L2). Warp w owns the 16-row
// m16 group rw = w / WS over the blocks of the slices sl·S/WS .. (sl+1)·S/WS − 1, sl = w % WS:
// WS ("slice lanes", 1, 2, 4 or 8) warps split K, which spreads short launches (o_proj: 3072 rows
// x K 8192 = 192 row groups) over many CTAs. The CTA walks "steps" u = 0 .. ceil(B/WS) − 1 in
// lockstep; at step u slice lane sl works on its range's block u. WS = 1: a warp folds its
// slices in registers; WS > 1: each slice's acc_j goes to shared memory and the epilogue folds
// them in slice order (the same operations: bits do not depend on WS). The host takes NT = 1 for
// M <= 8, 2 for M <= 16 and for every pre-converted launch (below), else 4 (tiles of 32 tokens:
// only when the planes workspace is missing), and the fewest slice lanes that give two CTAs per
// SM within the shared-memory budget (tall launches: WS = 1, a CTA of 128 rows stages x once for
// all of them; o_proj / out_proj / the router set: WS = 8, 16 rows per CTA); the lean form
// (below) takes the most slice lanes whose CTAs are all resident at once.
//
// Weights (A operand): thread (g = lane / 4, t4 = lane % 4) of a warp loads, per 64-k chunk, 16
// bytes at 16·t4 (bf16: 16·t4 and 64 + 16·t4) of rows n0 + g and n0 + g + 8, LDG.128 with
// running row pointers (one 64-bit add per row and chunk, immediate offsets, no bounds tests
// when K % 128 == 0), into a register ring of RC chunks refilled as soon as a chunk's A registers
// are built: NT = 1: FP8 / INT8 4 chunks = 128 B per thread, 32 KB per CTA, 64 KB per SM at two
// CTAs (bf16 2 chunks, the same bytes); the first RC chunks are requested before the PDL wait.
// FP8: each 32-bit word s of a chunk's load is two cvt e4m3x2 -> f16x2 (low and high half) = the
// A registers of k16 step s (rows g and g + 8: a0..a3): 0.5 conversions per weight; INT8: one
// LOP3 (^ 0x80808080) per word, one PRMT + one HSUB2 per pair; bf16: the loaded words are the A
// registers.
//
// Activations (B operand), per step: warp w owns the units w, w + 8, ... (unit = (slice lane,
// token), 128 k of x); lane L copies piece L (x[k 4L .. 4L + 3]) with cp.async one step ahead into
// a raw buffer that only it reads back (no barrier for it), then converts it: the warp's max |x|
// gives P, the lane scales, splits (f16, or bf16 hi/lo in bf16 CTAs) and writes ONE 16-byte
// fragment {hi b0, hi b1, lo b0, lo b1} of k16 step i and thread t4 (the permutation of the
// header), lane 0 the unit's 2^-P. Fragments are double-buffered (step u read while step u + 1 is
// written): ONE barrier per step. An MMA warp reads, per k16 step and n8 column block, one
// LDS.128 per lane at an immediate offset from a per-step base (a unit padded to 576 B keeps the
// two tokens of an LDS phase on different banks); lanes of tokens past the tile read the last
// token's fragment (their MMA columns are discarded; an MMA column depends only on its own B
// column).
//
// Per block, 16 rows and n8 block: 16 MMAs (8 k16 steps x hi/lo) from a zero accumulator, then
// 4 FFMA (FP8: 2 FMUL for s·2^-P first) into acc_j. Instructions per 64 weights of a thread (one
// block of its 2 rows, FP8, NT = 1), from the PTX (ptxas may fold the 16-bit moves of the
// conversions): 4 LDG.128, 32 cvt e4m3x2, 16 MMA, 8 LDS.128, 2 LDS (2^-P), 6 scale FMUL/FFMA,
// ~4 pointer adds and ~10 loop / refill / slice tests: ~1.3 per weight, plus the staging (~45 per
// warp and unit, 1/8 of a unit per warp and step at M = 1 with WS = 1, one unit per warp with
// WS = 8) and the barrier.
//
// The lean form (M <= 8, when the launch's whole x fits in at most 96 KB of fragments: M <= 2 at
// K 8192, M <= 7 at K 3072, M <= 8 at K <= 2048; chosen by the host, set_tc_gemv_form forces it
// on or off; the same bits): one tile, the same CTA rows / slice lanes as above, but x is staged
// ONCE in the prologue as the fragments of all B blocks of all tokens ([B][mt] units of 576 B +
// 2^-P [B][mt]; plain L2 loads, 6 units per warp in flight (gated 3), the same conversion) while
// the first weight chunks are in flight; after that one barrier every warp streams its rows and
// blocks on its own (no barrier until the WS > 1 slice fold). B-operand lanes past the token
// count read the last token's fragment (a broadcast). Weight ring: FP8 / INT8 6 chunks (192 B
// per thread, 6 KB per warp, 96 KB per SM at two CTAs of 8 warps; 8 chunks spilled at the 128
// registers of two CTAs per SM), bf16 4 chunks (the 256 B). x is read from L2 once per CTA
// (M·K·4 B: q_proj at M = 1, 256 CTAs of 64 rows: 3 MB of L2 reads against 50 MB of weights).
//
// The pre-converted form (kPre: 9 <= M <= 256 by default, any M when forced): a planes kernel converts
// x (gated: silu(g)·u) ONCE per launch into [B][M] units of 528 B in a workspace (the 512 B of
// fragments in their shared-memory order + 2^-P; f16 planes for FP8 / INT8 jobs, bf16 planes for
// bf16 jobs; the same conversion code as the lean form), and the stepped main loop copies its
// next step's units with cp.async (one 16-byte copy per lane and unit, issued before the MMAs,
// waited for before the step's barrier) instead of converting: no raw buffer, no conversion
// latency between the barriers. Token tiles of 16 (NT = 2) at two CTAs per SM (128 registers),
// instead of 32 tokens at one CTA per SM (254 registers); the smaller smem (no raw x) lets o_proj
// at M = 64 take WS = 4 (384 CTAs) instead of 48 CTAs. The weights are read by M / 16 tiles
// (the later tiles of a row block run next to the first: L2 hits). The workspace is a process-wide
// buffer that grows outside stream capture only (tc_gemv_reserve; a captured launch that would
// need more falls back to the in-CTA staging, the same bits).
//
// Shared memory (dynamic): fragments 2·WS·mt·576 B (2^-P inside each unit), raw x WS·mt·512 B
// (gated 1024; none with kPre), and for WS > 1 the slice partials S·(128/WS)·mt·4 B; at most the
// device's opt-in limit and 112 KB (the host lowers WS until it fits); opt-in above 48 KB.
// Roofline: the weight bytes once (N·K·{1, 1, 2} + scales), x per CTA (M·K·4 from L2), y.
// At M <= 8 the MMAs (one n8 block) cost what they cost at M = 1; at M = 64 (tiles of 32 tokens,
// 4 n8 blocks, two tiles) the MMAs and the per-CTA staging of x bound the kernel above the bytes.
#include "backend/cuda/ops_tc_gemv.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_tc_gemv_frag.cuh"
#include "backend/cuda/ops_tc_gemv_piece.cuh"
#include "backend/cuda/ops_tc_gemv_wgmma.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/row_weight_format.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockK = 128;
constexpr int kPdlMaxRows = 64;          // launches of up to this many tokens use PDL
// Dynamic shared memory per CTA: at most the device's opt-in limit (the DGX Spark: 99 KB) and
// 112 KB (two CTAs per H200 SM). Which slice-lane count a launch gets may so differ between
// devices; the bits do not.
constexpr size_t kSmemCap = 112 * 1024;
using namespace row_format;  // kFp8 / kInt8 / kBf16, fmt_of, with_format

struct TcJob {
  const uint8_t* w;
  const float* scale;  // FP8 block scales, INT8 row scales, bf16: unused
  float* y;
  int N;
  int fmt;
  int block_begin;  // first CTA row block of this job
  int accumulate;
};
struct TcJobs {
  TcJob job[kMaxRowJobs];
  int count;
};

// The launch's shape, CTA-uniform. S is a power of two (log2S): slice bounds are shifts.
struct TcShape {
  int M, K, B, S, log2S, WS, steps, tiles, mt_max;
};
// Slice j's first block (tc_gemv_slice_begin without the division).
__device__ __forceinline__ int slice_begin(const TcShape& sh, int j) { return (j * sh.B) >> sh.log2S; }

using tc_piece::silu_mul_value;
using tc_piece::store_acc_tile;
using tc_piece::store_y;

// The weight ring, in 64-k chunks (a chunk slot: a thread's 16-byte loads of one chunk for rows
// g and g + 8: FP8 / INT8 one per row, 8 registers; bf16 two per row, 16 registers). RC chunks
// are in flight per thread: FP8 / INT8 4 (128 B per thread, 32 KB per CTA), bf16 2 (the same
// bytes). (6 FP8 chunks spilled at the 128 registers of two CTAs per SM.) The step loop is
// unrolled by kU blocks so that 2·kU chunks are a whole number of ring turns (static slots).
template <int F, int NT>
inline constexpr int kRingChunks = F == kBf16 ? (NT == 1 ? 2 : 2) : (NT == 1 ? 4 : 4);
template <int F, int NT>
inline constexpr int kUnroll = kRingChunks<F, NT> == 6 || kRingChunks<F, NT> == 3 ? 3 : kRingChunks<F, NT> / 2;
using tc_piece::a_frag;
using tc_piece::Slot;
using tc_piece::WeightFeed;

// Shared-memory carve-up (bytes), the same on host and device. A unit is one (slice lane, token)
// pair of a step: 128 k of x. Fragments: two buffers (step u, step u + 1) of [WS][mt] units of
// 8 k16 steps x 4 t4 16-byte fragments, a unit padded to 576 B (the 8 lanes of an LDS.128 phase,
// two tokens, then cover all 32 banks) whose f32 at byte 512 is the unit's 2^-P (FP8 / INT8);
// raw x (in-CTA staging only): one buffer of [units][128] f32 (gated: g and u), private to the
// warp that copies and converts a unit; slice partials (WS > 1): [S][16·8/WS rows][mt] f32.
// With pre-converted planes (kPre) there is no raw buffer: the units are copied as they are.
constexpr int kUnitFragBytes = 576;
constexpr int kPinvByte = 512;  // 2^-P inside a unit (smem and the planes)
struct SmemLayout {
  int frag, raw, raw_u, partial, total;
};
__host__ __device__ inline SmemLayout smem_layout(int WS, int mt, int S, bool gated, bool pre) {
  SmemLayout l{};
  const int units = WS * mt;
  l.frag = 0;
  l.raw = l.frag + 2 * units * kUnitFragBytes;
  l.raw_u = l.raw + (pre ? 0 : units * 512);
  l.partial = l.raw_u + (gated && !pre ? units * 512 : 0);
  l.total = l.partial + (WS > 1 ? S * (16 * kWarps / WS) * mt * 4 : 0);
  return l;
}

// The staging of step u: warp w owns units w, w + 8, ... (unit = slice lane · mt + token), lane L
// piece L (x[k 4L .. 4L + 3] of the unit's block). stage_copy issues its cp.async copies of the
// raw x (one commit group); stage_convert, after the warp's wait, turns them into fragments. The
// same lane copies and reads a piece, so the raw buffer needs no barrier of its own.
template <bool kGated>
__device__ __forceinline__ void stage_copy(const TcShape& sh, const float* __restrict__ x, const float* __restrict__ u,
                                           int m0, int mt, int step, uint8_t* smem, const SmemLayout& L) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int SPL = sh.S / sh.WS;
  int sl = warp / mt, m = warp - sl * mt;
  for (int unit = warp; unit < sh.WS * mt; unit += kWarps) {
    const int b = slice_begin(sh, sl * SPL) + step;
    if (b < slice_begin(sh, (sl + 1) * SPL)) {  // else this slice lane's range is done
      const int k = b * kBlockK + 4 * lane;
      const bool in = k < sh.K;  // K % 16 == 0: a 16-byte piece is whole or past the row
      const size_t off = size_t(m0 + m) * size_t(sh.K) + (in ? size_t(k) : 0);
      const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem + L.raw + (unit * 128 + 4 * lane) * 4));
      mma_frag::cp_async16(dst, x + off, in ? 16 : 0);
      if constexpr (kGated) mma_frag::cp_async16(dst + uint32_t(L.raw_u - L.raw), u + off, in ? 16 : 0);
    }
    if (unit + kWarps < sh.WS * mt)
      for (m += kWarps; m >= mt; m -= mt) ++sl;  // the next unit's (slice lane, token)
  }
  mma_frag::cp_async_commit();
}

// Converts this warp's raw units of step u into the fragments of buffer buf (f16 split with P for
// FP8 / INT8 CTAs, bf16 split for bf16 CTAs). Waits for the warp's own copies first.
template <int F, bool kGated>
__device__ __forceinline__ void stage_convert(const TcShape& sh, int mt, int step, int buf, uint8_t* smem,
                                              const SmemLayout& L) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int SPL = sh.S / sh.WS, units = sh.WS * mt;
  mma_frag::cp_async_wait<0>();
  const float* raw = reinterpret_cast<const float*>(smem + L.raw);
  const float* raw_u = reinterpret_cast<const float*>(smem + L.raw_u);
  uint8_t* frag = smem + L.frag + buf * units * kUnitFragBytes;
  int sl = warp / mt, m = warp - sl * mt;
  for (int unit = warp; unit < units; unit += kWarps) {
    const int b = slice_begin(sh, sl * SPL) + step;
    if (b < slice_begin(sh, (sl + 1) * SPL)) {  // warp-uniform
      float4 v = *reinterpret_cast<const float4*>(raw + unit * 128 + 4 * lane);
      if constexpr (kGated) {
        const float4 uu = *reinterpret_cast<const float4*>(raw_u + unit * 128 + 4 * lane);
        v = make_float4(silu_mul_value(v.x, uu.x), silu_mul_value(v.y, uu.y), silu_mul_value(v.z, uu.z),
                        silu_mul_value(v.w, uu.w));
      }
      // (step i8, thread t4) of this lane's float4 (the permutation of ops_tc_gemv.h) and its pairs.
      int i8, t4;
      uint32_t h0, h1, l0, l1;
      const float pinv = tc_piece::split_piece<F>(v, lane, i8, t4, h0, h1, l0, l1);
      if (F != kBf16 && lane == 0) *reinterpret_cast<float*>(frag + unit * kUnitFragBytes + kPinvByte) = pinv;
      *reinterpret_cast<uint4*>(frag + unit * kUnitFragBytes + (i8 * 4 + t4) * 16) = make_uint4(h0, h1, l0, l1);
    }
    if (unit + kWarps < units)
      for (m += kWarps; m >= mt; m -= mt) ++sl;
  }
}

// Pre-converted planes (kPre; written by tc_gemv_planes_kernel): [B][M] units of kPlaneUnitBytes
// (the 512 fragment bytes of a unit in its smem order, then 2^-P at kPinvByte and 12 zero bytes):
// f16 (FP8 / INT8 CTAs) and bf16 (bf16 CTAs); either may be null when no job needs it.
constexpr int kPlaneUnitBytes = 528;
struct TcPlanes {
  const uint8_t* f16;
  const uint8_t* bf16;
};

// The kPre staging of step u into fragment buffer buf: the units of the stepped form (warp w owns
// units w, w + 8, ...; unit = slice lane · mt + token) copied from the planes, lane L the 16 bytes
// at 16·L, lane 0 also the 16 bytes with 2^-P (cp.async, L2 only; one commit group).
template <int F>
__device__ __forceinline__ void stage_copy_pre(const TcShape& sh, const TcPlanes& pl, int m0, int mt, int step, int buf,
                                               uint8_t* smem, const SmemLayout& L) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int SPL = sh.S / sh.WS, units = sh.WS * mt;
  const uint8_t* planes = F == kBf16 ? pl.bf16 : pl.f16;
  uint8_t* frag = smem + L.frag + buf * units * kUnitFragBytes;
  int sl = warp / mt, m = warp - sl * mt;
  for (int unit = warp; unit < units; unit += kWarps) {
    const int b = slice_begin(sh, sl * SPL) + step;
    if (b < slice_begin(sh, (sl + 1) * SPL)) {  // else this slice lane's range is done
      const uint8_t* src = planes + (size_t(b) * size_t(sh.M) + size_t(m0 + m)) * kPlaneUnitBytes;
      const uint32_t dst = uint32_t(__cvta_generic_to_shared(frag + unit * kUnitFragBytes));
      mma_frag::cp_async16(dst + 16 * lane, src + 16 * lane);
      if (F != kBf16 && lane == 0) mma_frag::cp_async16(dst + kPinvByte, src + kPinvByte);
    }
    if (unit + kWarps < units)
      for (m += kWarps; m >= mt; m -= mt) ++sl;
  }
  mma_frag::cp_async_commit();
}

template <int F>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool zero_c) {
  if constexpr (F == kBf16) {
    if (zero_c) mma_frag::mma_bf16_zc(c, a, b0, b1);
    else mma_frag::mma_bf16(c, a, b0, b1);
  } else {
    if (zero_c) tc_frag::mma_f16_zc(c, a, b0, b1);
    else tc_frag::mma_f16(c, a, b0, b1);
  }
}

// One CTA of format F: the whole main loop and the epilogue.
template <int F, int NT, bool kGated, bool kWhole, bool kPre>
__device__ __forceinline__ void tc_cta(const TcJob& job, const TcShape& sh, const float* __restrict__ x,
                                       const float* __restrict__ u, const TcPlanes& pl, int row_first, int m0, int mt,
                                       uint8_t* smem) {
  constexpr int RC = kRingChunks<F, NT>;
  constexpr int U = kUnroll<F, NT>;
  static_assert((2 * U) % RC == 0 && RC <= 2 * U, "2·U chunks must be whole ring turns");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int WS = sh.WS, SPL = sh.S / WS;
  const int sl = warp % WS, rw = warp / WS;
  const int n0 = row_first + 16 * rw;
  const bool active = n0 < job.N;  // warp-uniform; inactive warps still stage and meet the barriers
  const int j_first = sl * SPL;
  const int bb = slice_begin(sh, j_first);
  const int be = slice_begin(sh, j_first + SPL);
  const int chunks = 2 * (be - bb);  // this warp's chunks, in order
  // The layout for this CTA's own mt (the host sized the buffer for mt_max >= mt).
  const SmemLayout Lc = smem_layout(WS, mt, sh.S, kGated, kPre);

  // The thread's weight stream (tc_piece::WeightFeed) and FP8 block scales.
  const float* sp = F == kFp8 ? job.scale + size_t(min(n0, job.N - 1) / 128) * size_t(sh.B) + bb : nullptr;
  auto feed = WeightFeed<F, kWhole>::at(job.w, job.N, sh.K, n0, g, bb, t4);  // rows past N repeat N − 1

  Slot<F> ring[RC];
  float bscale[U];  // FP8: the block scales of the next U blocks (slot = step % U)
  auto request = [&](Slot<F>& s) { feed.request(s); };
  if (active) {
#pragma unroll
    for (int q = 0; q < RC; ++q)
      if (q < chunks) request(ring[q]);  // in flight while the previous kernel finishes
    if constexpr (F == kFp8) {
#pragma unroll
      for (int d = 0; d < U; ++d)
        if (bb + d < be) bscale[d] = __ldg(sp + d);
    }
  }
  pdl_wait();  // x, g, u and y may be written or read by earlier kernels; the weights never are

  if constexpr (kPre) {
    stage_copy_pre<F>(sh, pl, m0, mt, 0, 0, smem, Lc);
    mma_frag::cp_async_wait<0>();
  } else {
    stage_copy<kGated>(sh, x, u, m0, mt, 0, smem, Lc);
    stage_convert<F, kGated>(sh, mt, 0, 0, smem, Lc);
  }
  __syncthreads();

  const int units = WS * mt;
  float* partial = reinterpret_cast<float*>(smem + Lc.partial);
  const int cta_rows = 16 * (kWarps / WS);
  // This lane's fragments in buffer 0: unit (sl, token 8·nt + g) at k16 step i8 and t4: + i8·64
  // and + nt·8 units are immediates. The token is clamped into the tile (the MMA columns past the
  // tile compute garbage that is never stored; a column depends only on its own B column). Buffer
  // 1 is units·576 bytes further. pinv: the 2^-P of this lane's C columns (tokens 2·t4, +1).
  const int gq = min(g, mt - 1);  // NT > 1: mt > 8·(NT - 1) for every tile but the last
  const uint8_t* frag_lane = smem + Lc.frag + (sl * mt + gq) * kUnitFragBytes + t4 * 16;
  int bcol_off[NT], ccol[NT][2];  // ccol: byte offsets of this lane's C columns' 2^-P in buffer 0
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    bcol_off[nt] = (min(8 * nt + g, mt - 1) - gq) * kUnitFragBytes;
    ccol[nt][0] = Lc.frag + (sl * mt + min(8 * nt + 2 * t4, mt - 1)) * kUnitFragBytes + kPinvByte;
    ccol[nt][1] = Lc.frag + (sl * mt + min(8 * nt + 2 * t4 + 1, mt - 1)) * kUnitFragBytes + kPinvByte;
  }

  float acc[NT][4], tot[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f, tot[nt][i] = 0.0f;
  int j_cur = j_first;  // the slice being accumulated
  int slice_end = slice_begin(sh, j_cur + 1);

  for (int u0 = 0; u0 < sh.steps; u0 += U) {
#pragma unroll
    for (int d = 0; d < U; ++d) {
      const int step = u0 + d;
      if (step >= sh.steps) break;  // CTA-uniform
      const bool more = step + 1 < sh.steps;
      const int buf = step & 1;
      if (more) {  // in flight during the MMAs (kPre: into buffer buf ^ 1, free since the last barrier)
        if constexpr (kPre) stage_copy_pre<F>(sh, pl, m0, mt, step + 1, buf ^ 1, smem, Lc);
        else stage_copy<kGated>(sh, x, u, m0, mt, step + 1, smem, Lc);
      }
      const int b = bb + step;
      if (active && b < be) {  // warp-uniform
        float c[NT][4];
#pragma unroll
        for (int ch = 0; ch < 2; ++ch) {
          Slot<F>& slot = ring[(2 * d + ch) % RC];
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            uint32_t a[4];
            a_frag<F>(slot, s, a);
            const int i8 = 4 * ch + s;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const uint4 bf = *reinterpret_cast<const uint4*>(frag_lane + buf * units * kUnitFragBytes +
                                                               bcol_off[nt] + i8 * 64);
              mma<F>(c[nt], a, bf.x, bf.y, i8 == 0);
              mma<F>(c[nt], a, bf.z, bf.w, false);
            }
          }
          if (feed.next_chunk < chunks) request(slot);  // refill the slot just converted (chunk + RC)
        }
        // acc_j += C_b · factor (per token column).
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if constexpr (F == kBf16) {
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[nt][i] = __fadd_rn(acc[nt][i], c[nt][i]);
          } else {
            const uint8_t* pb = smem + buf * units * kUnitFragBytes;
            float f0 = *reinterpret_cast<const float*>(pb + ccol[nt][0]);
            float f1 = *reinterpret_cast<const float*>(pb + ccol[nt][1]);
            if constexpr (F == kFp8) f0 = __fmul_rn(bscale[d], f0), f1 = __fmul_rn(bscale[d], f1);
            acc[nt][0] = __fmaf_rn(c[nt][0], f0, acc[nt][0]);
            acc[nt][1] = __fmaf_rn(c[nt][1], f1, acc[nt][1]);
            acc[nt][2] = __fmaf_rn(c[nt][2], f0, acc[nt][2]);
            acc[nt][3] = __fmaf_rn(c[nt][3], f1, acc[nt][3]);
          }
        }
        if constexpr (F == kFp8)
          if (b + U < be) bscale[d] = __ldg(sp + (step + U));  // the scale of block b + U
        if (b + 1 == slice_end) {  // end of slice j_cur (warp-uniform)
          if (WS == 1) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) tot[nt][i] = j_cur == 0 ? acc[nt][i] : __fadd_rn(tot[nt][i], acc[nt][i]);
          } else {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int m = 8 * nt + 2 * t4 + (i & 1), r = 16 * rw + g + 8 * (i >> 1);
                if (m < mt) partial[(j_cur * cta_rows + r) * mt + m] = acc[nt][i];
              }
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
          ++j_cur;
          slice_end = slice_begin(sh, j_cur + 1);
        }
      }
      if (more) {
        if constexpr (kPre) mma_frag::cp_async_wait<0>();
        else stage_convert<F, kGated>(sh, mt, step + 1, buf ^ 1, smem, Lc);
      }
      __syncthreads();  // step + 1's fragments are visible; every warp is done with buffer buf
    }
  }

  // Epilogue: the INT8 row scale (once), then y (= or +=).
  if (WS == 1) {
    if (!active) return;
    store_acc_tile<F, NT>(job, n0, g, t4, m0, mt, [&](int j, int i) { return tot[j][i]; });
  } else {
    // Every warp's partials were written before the last step's barrier.
    for (int e = threadIdx.x; e < cta_rows * mt; e += kThreads) {
      const int m = e / cta_rows, r = e - m * cta_rows, n = row_first + r;
      if (n >= job.N) continue;
      float v = partial[r * mt + m];
      for (int j = 1; j < sh.S; ++j) v = __fadd_rn(v, partial[(j * cta_rows + r) * mt + m]);
      store_y<F>(job.y, job.N, m0 + m, n, v, F == kInt8 ? __ldg(job.scale + n) : 1.0f, job.accumulate);
    }
  }
}

// ---- The lean form (M <= 8 when the launch's whole x fits in shared memory) ----
//
// The CTA stages ALL of its tokens' x once, in the prologue, as the fragments of every block
// (the same values as the stepped form's per-step staging: P per (token, block), f16 hi/lo or
// bf16 hi/lo, the permuted order), then every warp streams its rows and blocks on its own: no
// barrier until the slice fold (WS > 1). Shared memory: fragments [B][mt] units of 576 B (unit
// (b, m) at (b·mt + m)·576: the two tokens of an LDS.128 phase on different banks), 2^-P [B][mt]
// f32, and for WS > 1 the slice partials [S][16·8/WS][mt] f32.
struct LeanLayout {
  int frag, pinv, partial, total;
};
__host__ __device__ inline LeanLayout lean_layout(int B, int WS, int mt, int S) {
  LeanLayout l{};
  l.frag = 0;
  l.pinv = B * mt * kUnitFragBytes;
  l.partial = l.pinv + ((B * mt * 4 + 15) / 16) * 16;
  l.total = l.partial + (WS > 1 ? S * (16 * kWarps / WS) * mt * 4 : 0);
  return l;
}
// The lean ring: FP8 / INT8 8 chunks (256 B per thread, 8 KB per warp), bf16 4 (the same bytes);
// the loop is unrolled by RC / 2 blocks (static slots).
template <int F>
inline constexpr int kLeanRing = F == kBf16 ? 4 : 6;

// Converts one 128-k piece (lane L: x[k 4L .. 4L + 3] of block b, token m) into its fragment
// (the permutation of ops_tc_gemv.h) and, for FP8 / INT8, returns 2^-P (the whole warp calls it).
template <int F>
__device__ __forceinline__ float convert_piece(float4 v, uint8_t* unit_frag, int lane) {
  int i8, t4;
  uint32_t h0, h1, l0, l1;
  const float pinv = tc_piece::split_piece<F>(v, lane, i8, t4, h0, h1, l0, l1);
  *reinterpret_cast<uint4*>(unit_frag + (i8 * 4 + t4) * 16) = make_uint4(h0, h1, l0, l1);
  return pinv;
}

// The lean prologue: warp w converts units w, w + 8, ... (unit = b·mt + m), kBatch units' loads
// in flight at once (L2 only: x was written by the previous kernel). Ends with the CTA barrier.
template <int F, bool kGated>
__device__ __forceinline__ void lean_stage(const TcShape& sh, const float* __restrict__ x,
                                           const float* __restrict__ u, int mt, uint8_t* smem,
                                           const LeanLayout& L) {
  constexpr int kBatch = kGated ? 3 : 6;  // (the weight ring's registers are live here too)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int units = sh.B * mt;
  float* pinv = reinterpret_cast<float*>(smem + L.pinv);
  for (int u0 = warp; u0 < units; u0 += kWarps * kBatch) {
    float4 v[kBatch], w[kBatch];
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int unit = u0 + q * kWarps;
      v[q] = w[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int b = unit / mt, m = unit - b * mt;
      const int k = b * kBlockK + 4 * lane;
      if (unit < units && k < sh.K) {  // K % 16 == 0: a 16-byte piece is whole or past the row
        const size_t off = size_t(m) * size_t(sh.K) + size_t(k);
        v[q] = __ldcg(reinterpret_cast<const float4*>(x + off));
        if constexpr (kGated) w[q] = __ldcg(reinterpret_cast<const float4*>(u + off));
      }
    }
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int unit = u0 + q * kWarps;
      if (unit < units) {  // warp-uniform
        float4 t = v[q];
        if constexpr (kGated)
          t = make_float4(silu_mul_value(t.x, w[q].x), silu_mul_value(t.y, w[q].y), silu_mul_value(t.z, w[q].z),
                          silu_mul_value(t.w, w[q].w));
        const float p = convert_piece<F>(t, smem + L.frag + unit * kUnitFragBytes, lane);
        if (F != kBf16 && lane == 0) pinv[unit] = p;
      }
    }
  }
  __syncthreads();
}

// One lean CTA of format F (tokens 0 .. mt − 1, mt <= 8): prologue, barrier-free main loop, fold.
template <int F, bool kGated, bool kWhole>
__device__ __forceinline__ void tc_cta_lean(const TcJob& job, const TcShape& sh, const float* __restrict__ x,
                                            const float* __restrict__ u, int row_first, int mt, uint8_t* smem) {
  constexpr int RC = kLeanRing<F>;
  constexpr int U = RC / 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int WS = sh.WS, SPL = sh.S / WS;
  const int sl = warp % WS, rw = warp / WS;
  const int n0 = row_first + 16 * rw;
  const bool active = n0 < job.N;  // warp-uniform; inactive warps still stage and meet the barriers
  const int j_first = sl * SPL;
  const int bb = slice_begin(sh, j_first);
  const int be = slice_begin(sh, j_first + SPL);
  const int nblocks = be - bb;  // >= 1 (slices are never empty)
  const int chunks = 2 * nblocks;
  const LeanLayout L = lean_layout(sh.B, WS, mt, sh.S);

  const float* sp = F == kFp8 ? job.scale + size_t(min(n0, job.N - 1) / 128) * size_t(sh.B) + bb : nullptr;
  auto feed = WeightFeed<F, kWhole>::at(job.w, job.N, sh.K, n0, g, bb, t4);  // rows past N repeat N − 1

  Slot<F> ring[RC];
  float bscale[U];
  auto request = [&](Slot<F>& s) { feed.request(s); };
  if (active) {
#pragma unroll
    for (int q = 0; q < RC; ++q)
      if (q < chunks) request(ring[q]);  // in flight while the previous kernel finishes
    if constexpr (F == kFp8) {
#pragma unroll
      for (int d = 0; d < U; ++d)
        if (d < nblocks) bscale[d] = __ldg(sp + d);
    }
  }
  pdl_wait();  // x, g, u and y may be written or read by earlier kernels; the weights never are
  lean_stage<F, kGated>(sh, x, u, mt, smem, L);

  float* partial = reinterpret_cast<float*>(smem + L.partial);
  const int cta_rows = 16 * (kWarps / WS);
  float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active) {
    // This lane's B column is token g, clamped to mt − 1: the lanes past the token count read the
    // last token's fragment (a broadcast within the LDS phase: no extra instructions or bank
    // conflicts; zero registers instead cost 4 MOVs + a predicated LDS per k16 step in the PTX);
    // their MMA columns are never stored (a column depends only on its own B column). Running
    // fragment pointer: unit (b, g) + t4·16; + i8·64 immediate.
    const uint8_t* fp = smem + L.frag + (bb * mt + min(g, mt - 1)) * kUnitFragBytes + t4 * 16;
    const float* pv = reinterpret_cast<const float*>(smem + L.pinv) + bb * mt;
    const int c0 = min(2 * t4, mt - 1), c1 = min(2 * t4 + 1, mt - 1);  // this lane's C columns
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int j_cur = j_first;
    int slice_end = slice_begin(sh, j_cur + 1);
    for (int u0 = 0; u0 < nblocks; u0 += U) {
#pragma unroll
      for (int d = 0; d < U; ++d) {
        const int step = u0 + d;
        if (step >= nblocks) break;  // warp-uniform
        const int b = bb + step;
        float c[4];
#pragma unroll
        for (int ch = 0; ch < 2; ++ch) {
          Slot<F>& slot = ring[(2 * d + ch) % RC];
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            uint32_t a[4];
            a_frag<F>(slot, s, a);
            const int i8 = 4 * ch + s;
            const uint4 bf = *reinterpret_cast<const uint4*>(fp + i8 * 64);
            mma<F>(c, a, bf.x, bf.y, i8 == 0);
            mma<F>(c, a, bf.z, bf.w, false);
          }
          if (feed.next_chunk < chunks) request(slot);  // refill the slot just converted (chunk + RC)
        }
        if constexpr (F == kBf16) {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[i] = __fadd_rn(acc[i], c[i]);
        } else {
          float f0 = pv[c0], f1 = pv[c1];
          if constexpr (F == kFp8) f0 = __fmul_rn(bscale[d], f0), f1 = __fmul_rn(bscale[d], f1);
          acc[0] = __fmaf_rn(c[0], f0, acc[0]);
          acc[1] = __fmaf_rn(c[1], f1, acc[1]);
          acc[2] = __fmaf_rn(c[2], f0, acc[2]);
          acc[3] = __fmaf_rn(c[3], f1, acc[3]);
        }
        if constexpr (F == kFp8)
          if (step + U < nblocks) bscale[d] = __ldg(sp + (step + U));  // the scale of block b + U
        fp += mt * kUnitFragBytes;
        pv += mt;
        if (b + 1 == slice_end) {  // end of slice j_cur (warp-uniform)
          if (WS == 1) {
#pragma unroll
            for (int i = 0; i < 4; ++i) tot[i] = j_cur == 0 ? acc[i] : __fadd_rn(tot[i], acc[i]);
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int m = 2 * t4 + (i & 1), r = 16 * rw + g + 8 * (i >> 1);
              if (m < mt) partial[(j_cur * cta_rows + r) * mt + m] = acc[i];
            }
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
          ++j_cur;
          slice_end = slice_begin(sh, j_cur + 1);
        }
      }
    }
  }

  if (WS == 1) {
    if (!active) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = n0 + g + 8 * (i >> 1), m = 2 * t4 + (i & 1);
      if (n >= job.N || m >= mt) continue;
      store_y<F>(job.y, job.N, m, n, tot[i], F == kInt8 ? __ldg(job.scale + n) : 1.0f, job.accumulate);
    }
  } else {
    __syncthreads();  // every warp's slice partials are written
    for (int e = threadIdx.x; e < cta_rows * mt; e += kThreads) {
      const int m = e / cta_rows, r = e - m * cta_rows, n = row_first + r;
      if (n >= job.N) continue;
      float v = partial[r * mt + m];
      for (int j = 1; j < sh.S; ++j) v = __fadd_rn(v, partial[(j * cta_rows + r) * mt + m]);
      store_y<F>(job.y, job.N, m, n, v, F == kInt8 ? __ldg(job.scale + n) : 1.0f, job.accumulate);
    }
  }
}

template <int NT, bool kGated, bool kWhole, bool kPre>
__global__ void __launch_bounds__(kThreads, NT == 1 || kPre ? 2 : 1)
    tc_gemv_kernel(const float* __restrict__ x, const float* __restrict__ u, TcJobs jobs, TcShape sh, TcPlanes pl) {
  pdl_launch_dependents();  // the next kernel's CTAs may become resident (they wait for us)
  extern __shared__ float4 tc_smem_f4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(tc_smem_f4);
  const int tile = int(blockIdx.x) % sh.tiles, rb = int(blockIdx.x) / sh.tiles;
  // The CTA's job, by static indices (a dynamic index would copy the parameters to local memory).
  TcJob job = jobs.job[0];
#pragma unroll
  for (int i = 1; i < kMaxRowJobs; ++i)
    if (i < jobs.count && rb >= jobs.job[i].block_begin) job = jobs.job[i];
  const int cta_rows = 16 * (kWarps / sh.WS);
  const int row_first = (rb - job.block_begin) * cta_rows;
  const int m0 = tile * 8 * NT, mt = min(8 * NT, sh.M - m0);
  with_format(job.fmt, [&](auto f) {
    tc_cta<decltype(f)::value, NT, kGated, kWhole, kPre>(job, sh, x, u, pl, row_first, m0, mt, smem);
  });
}

// The lean form: one CTA per row block, all tokens (M <= 8, one tile); two CTAs per SM.
template <bool kGated, bool kWhole>
__global__ void __launch_bounds__(kThreads, 2)
    tc_gemv_lean_kernel(const float* __restrict__ x, const float* __restrict__ u, TcJobs jobs, TcShape sh) {
  pdl_launch_dependents();
  extern __shared__ float4 tc_smem_f4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(tc_smem_f4);
  const int rb = int(blockIdx.x);
  TcJob job = jobs.job[0];
#pragma unroll
  for (int i = 1; i < kMaxRowJobs; ++i)
    if (i < jobs.count && rb >= jobs.job[i].block_begin) job = jobs.job[i];
  const int row_first = (rb - job.block_begin) * (16 * (kWarps / sh.WS));
  with_format(job.fmt, [&](auto f) {
    tc_cta_lean<decltype(f)::value, kGated, kWhole>(job, sh, x, u, row_first, sh.M, smem);
  });
}

// The planes pre-kernel (kPre launches, M > 8): converts the launch's x (gated: silu(g)·u, the same
// expression) ONCE into the f16 and / or bf16 planes (TcPlanes), one warp per unit (b, m) with
// convert_piece, the code of the lean form (the same bits as the in-CTA staging). Grid
// ceil(B·M / 8) CTAs of 8 warps. Roofline: M·K·4 bytes read, 2 x M·K·4.1 bytes written (L2).
template <bool kGated, bool kF16, bool kBf16P>
__global__ void __launch_bounds__(kThreads)
    tc_gemv_planes_kernel(const float* __restrict__ x, const float* __restrict__ u, int M, int K, int B, uint8_t* f16,
                          uint8_t* bf16) {
  pdl_launch_dependents();
  pdl_wait();  // x is written, the planes read, by earlier kernels
  const int lane = threadIdx.x & 31;
  const int unit = int(blockIdx.x) * kWarps + int(threadIdx.x >> 5);  // b·M + m
  if (unit >= B * M) return;                                          // warp-uniform
  const int b = unit / M, m = unit - b * M;
  const float4 v = tc_piece::load_piece<kGated>(x, u, K, m, b * kBlockK + 4 * lane);
  if constexpr (kF16) {
    uint8_t* dst = f16 + size_t(unit) * kPlaneUnitBytes;
    const float pinv = convert_piece<kFp8>(v, dst, lane);
    if (lane == 0) *reinterpret_cast<float4*>(dst + kPinvByte) = make_float4(pinv, 0.0f, 0.0f, 0.0f);
  }
  if constexpr (kBf16P) convert_piece<kBf16>(v, bf16 + size_t(unit) * kPlaneUnitBytes, lane);
}

int sm_count() { return current_device_sm_count(); }

size_t smem_budget() {
  static const size_t b = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return std::min(size_t(v > 0 ? v : 48 * 1024), kSmemCap);
  }();
  return b;
}

TcJob make_job(const RowGemvJob& j) {
  const DeviceLinear& w = *j.w;
  const int f = fmt_of(w);
  const uint8_t* bytes = f == kFp8    ? w.fp8.data()
                         : f == kInt8 ? reinterpret_cast<const uint8_t*>(w.int8.data())
                                      : reinterpret_cast<const uint8_t*>(w.dense.data());
  return TcJob{bytes, f == kBf16 ? nullptr : w.scale.data(), j.y, int(w.N), f, 0, j.accumulate ? 1 : 0};
}

// Numbers the jobs' row blocks consecutively and returns their count.
long long number_blocks(TcJobs& jobs, int cta_rows) {
  long long blocks = 0;
  for (int i = 0; i < jobs.count; ++i) {
    jobs.job[i].block_begin = int(blocks);
    blocks += (jobs.job[i].N + cta_rows - 1) / cta_rows;
  }
  return blocks;
}

std::atomic<int> g_split{0};
std::atomic<int> g_form{0};
std::atomic<bool> g_wgmma{true};
constexpr int kPreMinRows = 9;    // launches of at least this many tokens convert x once (kPre)
constexpr int kPreMaxRows = 256;  // and at most this many (the workspace: <= 2·64·256·528 B at K 8192)

// The planes workspace: one device buffer per process (the model runs on one device and one
// stream; consecutive launches on a stream reuse it in stream order; PDL keeps that order, since
// the planes kernel waits for the previous grid before it writes). It grows outside stream
// capture only (cudaMalloc is not capturable): a launch that would need a larger buffer while its
// stream is capturing falls back to the in-CTA staging (the same bits). tc_gemv_reserve sizes
// it ahead of a capture. Replaced buffers are kept, not freed: queued kernels may still read
// them (growth is geometric, so few are kept).
std::mutex g_planes_mu;
uint8_t* g_planes = nullptr;
size_t g_planes_bytes = 0;
std::vector<uint8_t*> g_planes_retired;

size_t planes_bytes(int M, int K, int kinds) {
  return size_t(kinds) * size_t((K + kBlockK - 1) / kBlockK) * size_t(M) * kPlaneUnitBytes;
}
uint8_t* planes_workspace(size_t bytes, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_planes_mu);
  if (g_planes_bytes >= bytes) return g_planes;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MOESERVE_CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
  if (st != cudaStreamCaptureStatusNone) return nullptr;
  const size_t want = std::max(bytes, 2 * g_planes_bytes);
  uint8_t* p = nullptr;
  MOESERVE_CUDA_CHECK(cudaMalloc(&p, want));
  if (g_planes) g_planes_retired.push_back(g_planes);
  g_planes = p;
  g_planes_bytes = want;
  return g_planes;
}
// The lean form's x fragments stay below this (two CTAs per H200 SM; the Spark's 99 KB).
constexpr size_t kLeanSmemCap = 96 * 1024;

template <bool kGated, bool kWhole>
void launch_lean(const float* x, const float* u, TcJobs jobs, TcShape sh, cudaStream_t stream) {
  const long long blocks = number_blocks(jobs, 16 * (kWarps / sh.WS));
  if (blocks > INT_MAX) throw Error("tc_gemv_f32: launch grid too large");
  const size_t smem = size_t(lean_layout(sh.B, sh.WS, sh.M, sh.S).total);
  auto kernel = tc_gemv_lean_kernel<kGated, kWhole>;
  if (smem > 48 * 1024) opt_in_dynamic_smem<tc_gemv_lean_kernel<kGated, kWhole>>(smem_budget());
  launch_pdl(true, kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, stream, x, u, jobs, sh);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <int NT, bool kGated, bool kWhole, bool kPre>
void launch_nt(const float* x, const float* u, TcJobs jobs, TcShape sh, TcPlanes pl, cudaStream_t stream) {
  const long long blocks = number_blocks(jobs, 16 * (kWarps / sh.WS));
  if (blocks * sh.tiles > INT_MAX) throw Error("tc_gemv_f32: launch grid too large");
  const size_t smem = size_t(smem_layout(sh.WS, sh.mt_max, sh.S, kGated, kPre).total);
  auto kernel = tc_gemv_kernel<NT, kGated, kWhole, kPre>;
  if (smem > 48 * 1024) opt_in_dynamic_smem<tc_gemv_kernel<NT, kGated, kWhole, kPre>>(smem_budget());
  launch_pdl(sh.M <= kPdlMaxRows, kernel, dim3(unsigned(blocks * sh.tiles)), dim3(kThreads), smem, stream, x, u,
             jobs, sh, pl);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <bool kGated, bool kF16, bool kBf16P>
void launch_planes(const float* x, const float* u, const TcShape& sh, TcPlanes pl, cudaStream_t stream) {
  const long long units = (long long)sh.B * sh.M;
  if ((units + kWarps - 1) / kWarps > INT_MAX) throw Error("tc_gemv_f32: planes grid too large");
  launch_pdl(sh.M <= kPdlMaxRows, tc_gemv_planes_kernel<kGated, kF16, kBf16P>,
             dim3(unsigned((units + kWarps - 1) / kWarps)), dim3(kThreads), 0, stream, x, u, sh.M, sh.K, sh.B,
             const_cast<uint8_t*>(pl.f16), const_cast<uint8_t*>(pl.bf16));
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <bool kGated>
void launch(const float* x, const float* u, int M, TcJobs& jobs, int K, cudaStream_t stream) {
  TcShape sh{};
  sh.M = M;
  sh.K = K;
  sh.B = (K + kBlockK - 1) / kBlockK;
  sh.S = tc_gemv_slices(sh.B);
  sh.log2S = sh.S == 8 ? 3 : sh.S == 4 ? 2 : sh.S == 2 ? 1 : 0;
  const int form = g_form.load(std::memory_order_relaxed);
  // The wgmma form (ops_tc_gemv_wgmma.h; sm_90 GPUs): the pre-converted range by shape, any M when
  // forced, when its workspace is there (split K only where the partial sums fit too).
  if ((form == 4 || (form == 0 && g_wgmma.load(std::memory_order_relaxed) && M >= kPreMinRows && M <= kPreMaxRows)) &&
      tc_wg::available()) {
    tc_wg::Jobs wj{};
    wj.count = jobs.count;
    for (int i = 0; i < jobs.count; ++i) {
      const TcJob& j = jobs.job[i];
      wj.job[i] = tc_wg::Job{j.w, j.scale, j.y, j.N, j.fmt, 0, j.accumulate};
    }
    for (bool split : {true, false}) {
      const tc_wg::Plan plan = tc_wg::plan(M, K, wj, split);
      // By shape, long launches of <= 16 tokens (the LM head) keep the mma.sync form, which streams
      // them faster there (PERF.md session 13, run 19: 304 vs 400 us at 16 tokens).
      if (form == 0 && plan.ntok == 16 && plan.blocks * plan.tiles > 4LL * sm_count()) break;
      if (uint8_t* p = planes_workspace(plan.bytes, stream)) {
        tc_wg::launch(plan, wj, x, u, kGated, p, stream);
        return;
      }
    }
  }
  // Pre-converted planes (M >= kPreMinRows, or forced): x converted once per launch by the planes
  // kernel, when the workspace is there (see planes_workspace).
  bool need_f16 = false, need_bf16 = false;
  for (int i = 0; i < jobs.count; ++i) (jobs.job[i].fmt == kBf16 ? need_bf16 : need_f16) = true;
  TcPlanes pl{nullptr, nullptr};
  if (form == 3 || form == 4 || (form == 0 && M >= kPreMinRows && M <= kPreMaxRows)) {
    uint8_t* p = planes_workspace(planes_bytes(M, K, int(need_f16) + int(need_bf16)), stream);
    if (p != nullptr) {
      pl.f16 = need_f16 ? p : nullptr;
      pl.bf16 = need_bf16 ? p + (need_f16 ? planes_bytes(M, K, 1) : 0) : nullptr;
    }
  }
  const bool pre = pl.f16 != nullptr || pl.bf16 != nullptr;
  // Token tiles: 8 (M <= 8), 16 (M <= 16, and every kPre launch: two CTAs per SM), else 32.
  const int NT = M <= 8 ? 1 : (M <= 16 || pre) ? 2 : 4;
  sh.tiles = (M + 8 * NT - 1) / (8 * NT);
  sh.mt_max = std::min(M, 8 * NT);
  auto ctas = [&](int ws) {
    long long blocks = 0;
    for (int i = 0; i < jobs.count; ++i) blocks += (jobs.job[i].N + 16 * (kWarps / ws) - 1) / (16 * (kWarps / ws));
    return blocks * sh.tiles;
  };
  // The lean form (M <= 8): when its whole-x layout fits (at one slice lane) and is not forced off.
  const size_t lean_cap = std::min(smem_budget(), kLeanSmemCap);
  const bool lean =
      !pre && NT == 1 && form != 1 && size_t(lean_layout(sh.B, 1, M, sh.S).total) <= lean_cap;
  auto fits = [&](int ws) {
    return lean ? size_t(lean_layout(sh.B, ws, M, sh.S).total) <= lean_cap
                : size_t(smem_layout(ws, sh.mt_max, sh.S, kGated, pre).total) <= smem_budget();
  };
  // Slice lanes (bits do not depend on them); or forced (set_tc_gemv_split).
  const int forced = g_split.load(std::memory_order_relaxed);
  int ws = 1;
  if (forced > 0) {
    while (2 * ws <= std::min(forced, sh.S) && fits(2 * ws)) ws *= 2;
  } else if (lean) {
    // Lean: the most slice lanes (the most warps streaming, the shortest) whose CTAs are all
    // resident at once (two per SM; q_proj: WS 2 = 256 CTAs, o_proj: WS 8 = 192, in_proj: WS 1);
    // launches that take several waves even at WS = 1 (the LM head) keep WS = 1.
    while (2 * ws <= sh.S && ctas(2 * ws) <= 2LL * sm_count() && fits(2 * ws)) ws *= 2;
  } else {
    // The fewest that still give two CTAs per SM (each CTA then stages x for the most rows)
    // (within 10%: q_proj's 1024 row groups at WS = 2 are 256 CTAs, one wave on 132 SMs).
    while (2 * ws <= sh.S && 10 * ctas(ws) < 18LL * sm_count() && fits(2 * ws)) ws *= 2;
  }
  sh.WS = ws;
  sh.steps = (sh.B + ws - 1) / ws;
  const bool whole = K % kBlockK == 0;
  if (pre) {
    if (pl.f16 && pl.bf16) launch_planes<kGated, true, true>(x, u, sh, pl, stream);
    else if (pl.f16) launch_planes<kGated, true, false>(x, u, sh, pl, stream);
    else launch_planes<kGated, false, true>(x, u, sh, pl, stream);
    // The main kernel reads the planes only (x, u unused).
    if (NT == 1) {
      if (whole) launch_nt<1, false, true, true>(x, u, jobs, sh, pl, stream);
      else launch_nt<1, false, false, true>(x, u, jobs, sh, pl, stream);
    } else {
      if (whole) launch_nt<2, false, true, true>(x, u, jobs, sh, pl, stream);
      else launch_nt<2, false, false, true>(x, u, jobs, sh, pl, stream);
    }
  } else if (lean) {
    if (whole) launch_lean<kGated, true>(x, u, jobs, sh, stream);
    else launch_lean<kGated, false>(x, u, jobs, sh, stream);
  } else if (NT == 1) {
    if (whole) launch_nt<1, kGated, true, false>(x, u, jobs, sh, pl, stream);
    else launch_nt<1, kGated, false, false>(x, u, jobs, sh, pl, stream);
  } else if (NT == 2) {
    if (whole) launch_nt<2, kGated, true, false>(x, u, jobs, sh, pl, stream);
    else launch_nt<2, kGated, false, false>(x, u, jobs, sh, pl, stream);
  } else {
    if (whole) launch_nt<4, kGated, true, false>(x, u, jobs, sh, pl, stream);
    else launch_nt<4, kGated, false, false>(x, u, jobs, sh, pl, stream);
  }
}

}  // namespace

void set_tc_gemv_split(int warps_over_k) {
  if (warps_over_k != 0 && warps_over_k != 1 && warps_over_k != 2 && warps_over_k != 4 && warps_over_k != 8)
    throw Error("set_tc_gemv_split: 0 (by shape), 1, 2, 4 or 8");
  g_split.store(warps_over_k, std::memory_order_relaxed);
}

void set_tc_gemv_form(int form) {
  if (form < 0 || form > 4)
    throw Error("set_tc_gemv_form: 0 (by shape), 1 (stepped), 2 (lean where it fits), 3 (pre-converted planes) or 4 "
                "(wgmma where available)");
  g_form.store(form, std::memory_order_relaxed);
}

void set_tc_gemv_wgmma(bool on) { g_wgmma.store(on, std::memory_order_relaxed); }

void tc_gemv_reserve(int max_M, int K) {
  if (max_M < kPreMinRows || K <= 0) return;
  size_t bytes = planes_bytes(std::min(max_M, kPreMaxRows), K, 2);
  if (tc_wg::available()) bytes = std::max(bytes, tc_wg::reserve_bytes(std::min(max_M, kPreMaxRows), K));
  planes_workspace(bytes, nullptr);
}

bool tc_gemv_supported(const DeviceLinear& w) {
  if (w.N <= 0 || w.K <= 0 || w.K % 16 != 0 || w.N > INT_MAX / 2 || w.K > INT_MAX / 4) return false;
  const size_t nk = size_t(w.N) * size_t(w.K);
  const size_t blocks = size_t((w.K + kBlockK - 1) / kBlockK);
  switch (w.format) {
    case quant::WeightFormat::Fp8Block:
      return w.fp8.size() == nk && w.scale.size() >= size_t((w.N + 127) / 128) * blocks;
    case quant::WeightFormat::Int8Rowwise:
      return w.int8.size() == nk && w.scale.size() >= size_t(w.N);
    case quant::WeightFormat::Dense:
    case quant::WeightFormat::Nvfp4:
      return w.dense.size() == nk;
    default:
      return false;
  }
}

bool tc_gemv_gated_supported(const DeviceLinear& w) { return tc_gemv_supported(w); }

void tc_gemv_f32(const float* x, int M, std::span<const RowGemvJob> jobs, cudaStream_t stream) {
  if (M <= 0 || jobs.empty()) return;
  const int64_t K = jobs[0].w->K;
  for (const auto& j : jobs)
    if (!tc_gemv_supported(*j.w) || j.w->K != K)
      throw Error("tc_gemv_f32: every job needs an FP8 / INT8 / bf16 weight with the same K, K % 16 == 0");
  for (size_t b = 0; b < jobs.size(); b += kMaxRowJobs) {  // more than kMaxRowJobs: several launches
    TcJobs js{};
    js.count = int(std::min(jobs.size() - b, size_t(kMaxRowJobs)));
    for (int i = 0; i < js.count; ++i) js.job[i] = make_job(jobs[b + size_t(i)]);
    launch<false>(x, nullptr, M, js, int(K), stream);
  }
}

void tc_gemv_f32_gated(const float* g, const float* u, int M, const DeviceLinear& w, float* y, bool accumulate,
                       cudaStream_t stream) {
  if (M <= 0) return;
  if (!tc_gemv_gated_supported(w)) throw Error("tc_gemv_f32_gated: needs an FP8 / INT8 / bf16 weight, K % 16 == 0");
  TcJobs js{};
  js.count = 1;
  js.job[0] = make_job(RowGemvJob{&w, y, accumulate});
  launch<true>(g, u, M, js, int(w.K), stream);
}

}  // namespace moeserve::cuda
