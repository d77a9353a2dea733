// tc_gemv's wgmma form (ops_tc_gemv_wgmma.h): the arithmetic of ops_tc_gemv.h (per 128-k block b,
// C_b = 8 k16 steps x (hi, lo) from +0 with f32 accumulation; acc_j = fma(C_b, s_b·2^-P, acc_j) per
// slice j (bf16: acc_j + C_b); y = acc_0 + acc_1 + ... in slice order; INT8: y·s_row) on Hopper
// wgmma m64nNk16 (sm_90a code, run on sm_90 GPUs; the DGX Spark keeps the mma.sync forms). The
// weights are the A operand in registers, exactly the mma.sync kernels' A registers (the same
// 16-byte loads, e4m3 / int8 -> f16 conversions and k permutation: a warp's 16 rows in
// mma.m16n8k16's A layout are what wgmma's register A fragment holds); the tokens' hi / lo planes are
// the B operand in shared memory. Each MMA step has the operands of its mma.sync twin, in the same
// order, so the same bits (tests/gpu/test_ops_tc_gemv.cpp: every form against a token alone).
//
// Why: at 64 tokens the mma.sync forms spend their time on the B fragments (one LDS.128 per two
// MMAs per warp), on registers (tiles of 16 tokens, so the weights go through the SMs 4 times) and
// on a barrier per block at 2 CTAs per SM (PERF.md run U7: q_proj 78 us for 50 MB). wgmma reads B
// from shared memory for all 4 warps of a warpgroup, takes 64 tokens in one instruction, and runs
// asynchronously.
//
// Layout. x f32 [M, K] (gated: g, u). W [N, K] row-major (FP8 e4m3 + block scales, INT8 + row
// scales, bf16). y f32 [M, N]. Planes (the workspace, written by tc_wg_planes_kernel): per plane
// kind (f16 for FP8 / INT8 jobs, bf16 for bf16 jobs), per (block b, token tile t) an image of
// 512·NT bytes = [hi, lo][4 sub-tiles of 32 logical k][NT tokens][64 bytes], the 16-byte chunk c
// of token row r at r·64 + 16·(c ^ ((r >> 1) & 3)) (wgmma.cuh desc_sw64), so a stage is one
// contiguous copy; logical k 16·i8 + kk of the block (k16 step i8, kk = 0..15) is the mma.sync B
// fragment's k kk of step i8 (split_piece: h0 -> kk 2·t4, +1; h1 -> kk 8 + 2·t4, +1). 2^-P per
// (b, token) f32 [B][Mpad] (Mpad = tiles·NT; tokens >= M are zeros, P = 0).
//
// Parallelisation. CTA = 2 warpgroups (256 threads) = 128 rows of one job (64 per warpgroup, 16
// per warp as in the mma.sync kernels) x one token tile x one K part (ksplit parts, each a run of
// S / ksplit slices). The B stages (4) are filled by bulk copies completing on a barrier per stage;
// per block each warpgroup waits for its stage, converts its A registers (8 k16 steps), issues 16
// wgmmas (hi, lo per step) into C, waits, folds C into acc_j (one FFMA per output) and releases the
// stage (the second warpgroup to release it refills it 4 blocks ahead): the warpgroups are not in
// lockstep, so one's conversion and fold overlap the other's MMAs. At a slice's end acc_j goes into
// tot (ksplit 1, in shared memory) or to the partial workspace [row block, tile][S][128 rows][NT]
// (ksplit > 1), where the last CTA of a (row block, tile) to arrive (a counter per pair, set back
// to 0 by it) folds the S partials in order. Weights: a ring of RC 64-k chunks per thread in
// registers (4 = 2 blocks ahead: FP8 / INT8 128 bytes per thread, bf16 256), the first requested
// before the PDL wait, and an L2 prefetch kPrefetch blocks ahead. One CTA per SM; 16-token launches
// of more CTAs than SMs run two per SM (kPair; bf16 with a 1-block ring).
// The main loop is unrolled over kUnroll = 2 blocks (static ring slots, dynamic stage): unrolled
// over the 4 stages, as first written, the loop missed the instruction cache (PERF.md session 16).
//
// Shared memory: 4 stages of 512·NT + 512 bytes (image, 2^-P) and the running slice sums (NT / 2
// floats per thread): 164 KB at NT 64.
// Roofline (q_proj, 16384 x 3072 FP8, 64 tokens): 50 MB of weights (~12 us at 4.3 TB/s) and
// 2·64·16384·3072·2 = 12.9 GFLOP of f16 MMAs (~13 us at the dense f16 peak): both about equal;
// x as planes from L2: 64·3072·4 B per CTA. Measured: ~35-39 us (PERF.md sessions 13, 16), ~1.4 us
// per block and CTA where the 32 m64n64k16 wgmmas alone take 0.58 us (session 16's probe: one
// chain of register-A wgmmas per warpgroup runs at ~960 TFLOP/s, bench_wgmma_chain): the time is
// outside the MMAs; halving the stage images changed 1-2% (the LM head 8%): not L2 bandwidth.
#include "backend/cuda/ops_tc_gemv_wgmma.h"

#include <climits>
#include <string>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_quant_gemv.h"
#include "backend/cuda/ops_tc_gemv.h"
#include "backend/cuda/ops_tc_gemv_frag.cuh"
#include "backend/cuda/ops_tc_gemv_piece.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/row_weight_format.cuh"
#include "backend/cuda/smem_opt_in.h"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace moeserve::cuda::tc_wg {
static_assert(kMaxJobs == kMaxRowJobs, "one launch holds the jobs of one tc_gemv launch");

namespace {

using namespace row_format;  // kFp8 / kInt8 / kBf16, with_format
using tc_piece::a_frag;
using tc_piece::store_acc_tile;
using tc_piece::store_y;
using tc_piece::y_at;
using tc_piece::y_value;
using tc_piece::Slot;
using tc_piece::WeightFeed;

constexpr int kThreads = 256;
constexpr int kRows = 128;  // rows per CTA: 2 warpgroups x 64
constexpr int kBK = 128;
constexpr int kStages = 4;  // B stages (images) in shared memory
// The main loop's unroll: ring slots are static register indices, so a ring turn (RC chunks, 2 per
// block) must divide 2·kUnroll; the stage index is dynamic. Two, not kStages: each unrolled block
// is ~500 SASS instructions (three formats per kernel), and at four the loop did not fit the
// instruction cache (PERF.md session 16: 32% of stall samples waiting for instructions).
constexpr int kUnroll = 2;
constexpr int kMaxArrivals = 4096;
__device__ unsigned g_wg_arrivals[kMaxArrivals];  // per (row block, tile) of a split launch; 0 between

template <int NT>
struct Cfg {
  static constexpr int kSub = NT * 64;           // one sub-tile: NT rows of 64 bytes
  static constexpr int kImage = 8 * kSub;        // hi (4 sub-tiles), lo (4)
  static constexpr int kPinvOff = kImage;        // NT floats
  static constexpr int kStageBytes = kImage + 512;
  static constexpr int kTotOff = kStages * kStageBytes;  // the slice fold's running sum: [NT / 2][256] f32
  static constexpr int kBarOff = kTotOff + NT / 2 * kThreads * 4;  // kStages mbarriers, kStages release counts
  static constexpr int kSmem = kBarOff + 16 * kStages + 512;  // + alignment slack
  static constexpr int kNB = NT / 8;             // n8 blocks of the accumulator
  static constexpr int kImgChunks = kImage / 16 / kThreads;  // 16-byte copies per thread and stage
  static_assert(kImgChunks * 16 * kThreads == kImage, "whole copies");
};

struct Shape {
  int M, K, B, S, log2S, ntok, tiles, ksplit, Mpad;
};
__device__ __forceinline__ int slice_begin(const Shape& sh, int j) { return (j * sh.B) >> sh.log2S; }

// The ring of weight chunks per thread (tc_piece::Slot: its 16-byte loads of one 64-k chunk for
// rows g and g + 8): two blocks ahead (one with kPair's bf16), the blocks after that prefetched into
// L2 kPrefetch blocks ahead (WeightFeed::prefetch_block), so the ring costs 32 registers, not 64.
template <int F, bool kPair>
inline constexpr int kRing = F == kBf16 ? (kPair ? 2 : 4) : 4;
constexpr int kPrefetch = 6;

// One CTA of format F.
template <int F, int NT, bool kWhole, bool kPair>
__device__ __forceinline__ void wg_cta(const Job& job, const Shape& sh, const uint8_t* __restrict__ img,
                                       const float* __restrict__ pinv_g, float* __restrict__ partial, int rb, int tile,
                                       int part, int row_first, unsigned char* smem, uint32_t sbase) {
#if defined(MOESERVE_WGMMA_ENABLED)
  using C = Cfg<NT>;
  constexpr int NB = C::kNB, RC = kRing<F, kPair>;
  static_assert((2 * kUnroll) % RC == 0, "the unrolled loop covers whole ring turns");
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, t4 = lane & 3;
  const int n_wg = row_first + 64 * wg;   // the warpgroup's first row
  const int n0 = n_wg + 16 * wi;          // the warp's
  const bool wg_active = n_wg < job.N;    // warpgroup-uniform (wgmma is warpgroup-collective)
  const int spc = sh.S / sh.ksplit;       // slices per part
  const int j_first = part * spc;
  const int bb = slice_begin(sh, j_first), be = slice_begin(sh, j_first + spc);
  const int nb = be - bb, chunks = 2 * nb;
  const int m0 = tile * NT, mt = min(NT, sh.M - m0);
  if (tid == 0) {  // the stages' barriers and release counts (published by the barrier below)
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      bulk::mbar_init(sbase + uint32_t(C::kBarOff + 8 * s), 1);
      reinterpret_cast<int*>(smem + C::kBarOff + 8 * kStages)[s] = 0;
    }
    bulk::mbar_init_fence();
  }
  __syncthreads();

  // Weights: the thread's stream (tc_piece::WeightFeed) and FP8 block scales.
  const float* sp = F == kFp8 ? job.scale + size_t(min(n0, job.N - 1) / 128) * size_t(sh.B) + bb : nullptr;
  auto feed = WeightFeed<F, kWhole>::at(job.w, job.N, sh.K, n0, g, bb, t4);  // rows past N repeat N − 1
  Slot<F> ring[RC];
  auto request = [&](Slot<F>& s) { feed.request(s); };
  if (wg_active) {
#pragma unroll
    for (int q = 0; q < RC; ++q)
      if (q < chunks) request(ring[q]);  // in flight while the previous kernel finishes
    for (int b = RC / 2; b < kPrefetch && b < nb; ++b) feed.prefetch_block(b);
  }
  pdl_wait();  // the planes (and y) are written by earlier kernels; the weights never are

  // Stage fills: the (b, tile) image (contiguous) and the tile's 2^-P, two bulk copies completing on
  // the stage's barrier, issued by one thread. A stage is refilled (block + kStages) by the second
  // warpgroup to be done with it, so the warpgroups run on their own (one folds or converts while
  // the other's MMAs run) within the ring.
  const uint8_t* img_tile = img + size_t(tile) * C::kImage;
  const size_t img_step = size_t(sh.tiles) * C::kImage;  // next block
  const uint32_t bar0 = sbase + uint32_t(C::kBarOff);   // the stages' barriers, 8 bytes each
  int* releases = reinterpret_cast<int*>(smem + C::kBarOff + 8 * kStages);  // per stage, +1 per warpgroup
  auto load_stage = [&](int slot, int b) {
    const uint32_t st = sbase + uint32_t(slot * C::kStageBytes), bar = bar0 + uint32_t(8 * slot);
    bulk::arrive_expect_tx(bar, uint32_t(C::kImage + NT * 4));
    bulk::copy_g2s(st, img_tile + size_t(b) * img_step, uint32_t(C::kImage), bar);
    bulk::copy_g2s(st + uint32_t(C::kPinvOff), pinv_g + size_t(b) * size_t(sh.Mpad) + size_t(m0), uint32_t(NT * 4), bar);
  };
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      if (s < nb) load_stage(s, bb + s);
    }
  }

  float acc[NB][4];
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  // y's running slice fold (ksplit 1) in shared memory, this thread's column of it (registers go to
  // the weight ring instead).
  float* tot = reinterpret_cast<float*>(smem + C::kTotOff) + tid;
  int j_cur = j_first;
  int slice_end = slice_begin(sh, j_cur + 1);
  const size_t pbase = (size_t(rb) * size_t(sh.tiles) + size_t(tile)) * size_t(sh.S) * (kRows * NT);
  const int r_loc = 64 * wg + 16 * wi + g;  // this thread's first row in the CTA

  for (int it0 = 0; it0 < nb; it0 += kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int it = it0 + u;
      if (it >= nb) break;  // CTA-uniform
      const int d = it % kStages;  // the block's stage
      bulk::wait_parity(bar0 + uint32_t(8 * d), uint32_t((it / kStages) & 1));  // block it's stage is full
      if (wg_active) {
        const unsigned char* stp = smem + d * C::kStageBytes;
        const uint32_t st = sbase + uint32_t(d * C::kStageBytes);
        const float fb = F == kFp8 ? __ldg(sp + it) : 1.0f;
        if (it + kPrefetch < nb) feed.prefetch_block(it + kPrefetch);
        uint32_t af[8][4];
#pragma unroll
        for (int ch = 0; ch < 2; ++ch) {
          Slot<F>& slot = ring[(2 * u + ch) % RC];  // = chunk 2·it + ch's slot (it0 even)
#pragma unroll
          for (int s = 0; s < 4; ++s) a_frag<F>(slot, s, af[4 * ch + s]);
          if (feed.next_chunk < chunks) request(slot);  // refill the slot just converted (chunk + RC)
        }
        float c[NB][4];
#pragma unroll
        for (int j = 0; j < NB; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) c[j][i] = 0.0f;
        const uint64_t desc = wgmma::desc_sw64(st);
        wgmma::fence();
#pragma unroll
        for (int i8 = 0; i8 < 8; ++i8) {
          const uint32_t off = uint32_t((i8 >> 1) * C::kSub + (i8 & 1) * 32);
          wgmma::mma_m64nNk16_f16_rs<NT, F == kBf16>(c, af[i8], wgmma::desc_advance(desc, off));
          wgmma::mma_m64nNk16_f16_rs<NT, F == kBf16>(c, af[i8], wgmma::desc_advance(desc, uint32_t(4 * C::kSub) + off));
        }
        wgmma::commit_group();
        wgmma::wait_group<0>();
#pragma unroll
        for (int j = 0; j < NB; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) wgmma::fence_operand(c[j][i]);
#pragma unroll
        for (int i8 = 0; i8 < 8; ++i8)
#pragma unroll
          for (int i = 0; i < 4; ++i) wgmma::fence_operand(af[i8][i]);
        // acc_j += C_b · factor (per token column), tc_gemv's operations.
        const float* pv = reinterpret_cast<const float*>(stp + C::kPinvOff);
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          if constexpr (F == kBf16) {
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][i] = __fadd_rn(acc[j][i], c[j][i]);
          } else {
            float f0 = pv[8 * j + 2 * t4], f1 = pv[8 * j + 2 * t4 + 1];
            if constexpr (F == kFp8) f0 = __fmul_rn(fb, f0), f1 = __fmul_rn(fb, f1);
            acc[j][0] = __fmaf_rn(c[j][0], f0, acc[j][0]);
            acc[j][1] = __fmaf_rn(c[j][1], f1, acc[j][1]);
            acc[j][2] = __fmaf_rn(c[j][2], f0, acc[j][2]);
            acc[j][3] = __fmaf_rn(c[j][3], f1, acc[j][3]);
          }
        }
        if (bb + it + 1 == slice_end) {  // end of slice j_cur
          if (sh.ksplit == 1) {
#pragma unroll
            for (int j = 0; j < NB; ++j)
#pragma unroll
              for (int i = 0; i < 4; ++i) {
              float& t = tot[(4 * j + i) * kThreads];
              t = j_cur == 0 ? acc[j][i] : __fadd_rn(t, acc[j][i]);
            }
          } else {
            float* pp = partial + pbase + size_t(j_cur) * (kRows * NT);
#pragma unroll
            for (int j = 0; j < NB; ++j)
#pragma unroll
              for (int i = 0; i < 4; ++i) pp[(r_loc + 8 * (i >> 1)) * NT + 8 * j + 2 * t4 + (i & 1)] = acc[j][i];
          }
#pragma unroll
          for (int j = 0; j < NB; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
          ++j_cur;
          slice_end = slice_begin(sh, j_cur + 1);
        }
      }
      // Release the stage: this warpgroup's MMAs are done and its 2^-P reads too; the second
      // warpgroup to release it refills it.
      if (wg == 0) bulk::named_barrier<1, 128>();
      else bulk::named_barrier<2, 128>();
      if ((tid & 127) == 0 && (atomicAdd(&releases[d], 1) & 1) == 1 && it + kStages < nb) {
        bulk::fence_proxy_async();
        load_stage(d, bb + it + kStages);
      }
    }
  }

  if (sh.ksplit == 1) {
    if (!wg_active) return;
    store_acc_tile<F, NB>(job, n0, g, t4, m0, mt, [&](int j, int i) { return tot[(4 * j + i) * kThreads]; });
    return;
  }
  // Split K: the last part to arrive folds the S slice partials in order.
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned idx = unsigned(rb * sh.tiles + tile);
    const unsigned old = atomicAdd(&g_wg_arrivals[idx], 1u);
    s_last = old == unsigned(sh.ksplit - 1);
    if (s_last) g_wg_arrivals[idx] = 0u;  // no other part of this launch touches it again
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Four consecutive tokens of a row per thread and quad; kU quads per thread at a time, every load
  // of them (each slice's float4, the INT8 row scale, the y values an accumulating job adds to)
  // requested before the in-order sums: the fold is L2 latency, so one round trip per kU quads
  // (two steps of one quad each, loading y after the sums, took ~4x as many: PERF.md session 16).
  constexpr int kQuads = kRows * NT / 4;
  constexpr int kU = kQuads / kThreads < 4 ? kQuads / kThreads : 4;  // 2 at NT 16 (kPair: <= 128 registers)
  const size_t sstride = size_t(kRows) * NT;
  for (int q0 = tid; q0 < kQuads; q0 += kU * kThreads) {
    float4 v[kU][8];
    float old[kU][4], rs[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int q = q0 + u * kThreads;
      if (q >= kQuads) break;
      const int e = 4 * q, r = e / NT, m = e - r * NT, n = row_first + r;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < sh.S) v[u][j] = __ldcg(reinterpret_cast<const float4*>(partial + pbase + size_t(j) * sstride + size_t(e)));
      rs[u] = F == kInt8 && n < job.N ? __ldg(job.scale + n) : 1.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        old[u][c] = job.accumulate && n < job.N && m + c < mt ? y_at(job.y, job.N, m0 + m + c, n) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int q = q0 + u * kThreads;
      if (q >= kQuads) break;
      const int e = 4 * q, r = e / NT, m = e - r * NT, n = row_first + r;
      if (n >= job.N) continue;
      float o[4] = {v[u][0].x, v[u][0].y, v[u][0].z, v[u][0].w};
#pragma unroll
      for (int j = 1; j < 8; ++j)
        if (j < sh.S) {
          o[0] = __fadd_rn(o[0], v[u][j].x), o[1] = __fadd_rn(o[1], v[u][j].y);
          o[2] = __fadd_rn(o[2], v[u][j].z), o[3] = __fadd_rn(o[3], v[u][j].w);
        }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (m + c >= mt) break;
        y_at(job.y, job.N, m0 + m + c, n) = y_value<F>(o[c], rs[u], job.accumulate, old[u][c]);
      }
    }
  }
#else
  (void)job, (void)sh, (void)img, (void)pinv_g, (void)partial, (void)rb, (void)tile, (void)part, (void)row_first;
  (void)smem, (void)sbase;
#endif
}

// One CTA per SM; kPair (16 tokens, launches of more CTAs than SMs): two, with half the ring each
// (<= 128 registers; the same bytes in flight per SM), so that a grid of up to 2 x SMs is one wave
// (PERF.md session 13, runs 20-21: in_proj at 16 tokens 46 us instead of 63; a one-wave q_proj is
// faster with one CTA per SM and the whole ring, 29 us instead of 44).
template <int NT, bool kWhole, bool kPair>
__global__ void __launch_bounds__(kThreads, kPair ? 2 : 1)
    tc_wg_kernel(Jobs jobs, Shape sh, const uint8_t* img_f16, const uint8_t* img_bf16, const float* pinv,
                 float* partial) {
#if defined(MOESERVE_WGMMA_ENABLED)
  pdl_launch_dependents();
  extern __shared__ __align__(16) unsigned char wg_raw[];
  uint32_t sbase = 0;
  unsigned char* smem = wgmma::align_smem_512(wg_raw, sbase);
  const int part = int(blockIdx.x) % sh.ksplit, rest = int(blockIdx.x) / sh.ksplit;
  const int tile = rest % sh.tiles, rb = rest / sh.tiles;
  Job job = jobs.job[0];  // by static indices (a dynamic index would copy the parameters to local memory)
#pragma unroll
  for (int i = 1; i < kMaxJobs; ++i)
    if (i < jobs.count && rb >= jobs.job[i].block_begin) job = jobs.job[i];
  const int row_first = (rb - job.block_begin) * kRows;
  with_format(job.fmt, [&](auto f) {
    constexpr int F = decltype(f)::value;
    wg_cta<F, NT, kWhole, kPair>(job, sh, F == kBf16 ? img_bf16 : img_f16, pinv, partial, rb, tile, part, row_first, smem,
                          sbase);
  });
#else
  (void)jobs, (void)sh, (void)img_f16, (void)img_bf16, (void)pinv, (void)partial;
  __trap();  // never launched: available() is false without sm_90a code
#endif
}

// The planes: one warp per (block b, token m < Mpad), split_piece per plane kind (the bits of the
// mma.sync forms' staging), each lane's four pairs to their swizzled image positions, lane 0 the
// f16 kind's 2^-P. Tokens >= M are zeros. Roofline: M·K·4 bytes read, Mpad·K·4 (+ 4·Mpad·B) written
// per kind (L2).
template <bool kGated, bool kF16, bool kBf16P>
__global__ void __launch_bounds__(kThreads)
    tc_wg_planes_kernel(const float* __restrict__ x, const float* __restrict__ u, Shape sh, uint8_t* img_f16,
                        uint8_t* img_bf16, float* pinv) {
  pdl_launch_dependents();
  pdl_wait();  // x is written, the planes read, by earlier kernels
  const int lane = threadIdx.x & 31;
  const int unit = int(blockIdx.x) * (kThreads / 32) + int(threadIdx.x >> 5);  // b·Mpad + m
  if (unit >= sh.B * sh.Mpad) return;                                           // warp-uniform
  const int b = unit / sh.Mpad, m = unit - b * sh.Mpad;
  // Tokens past M (tile padding) are zeros: their MMA columns are never stored.
  const float4 v = m < sh.M ? tc_piece::load_piece<kGated>(x, u, sh.K, m, b * kBK + 4 * lane)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int NT = sh.ntok, tile = m / NT, r = m - tile * NT;
  const size_t image = (size_t(b) * size_t(sh.tiles) + size_t(tile)) * size_t(8 * 64) * size_t(NT);
  auto put = [&](uint8_t* base, int i8, int t4, uint32_t h0, uint32_t h1, uint32_t l0, uint32_t l1) {
    const int sub = i8 >> 1, c0 = 2 * (i8 & 1);  // chunks c0 (k 0..7 of the step), c0 + 1 (k 8..15)
    const int swz = (r >> 1) & 3;
    uint8_t* row = base + image + size_t(sub * NT * 64 + r * 64 + 4 * t4);
    const size_t lo = size_t(4 * NT * 64);
    *reinterpret_cast<uint32_t*>(row + 16 * (c0 ^ swz)) = h0;
    *reinterpret_cast<uint32_t*>(row + 16 * ((c0 + 1) ^ swz)) = h1;
    *reinterpret_cast<uint32_t*>(row + lo + 16 * (c0 ^ swz)) = l0;
    *reinterpret_cast<uint32_t*>(row + lo + 16 * ((c0 + 1) ^ swz)) = l1;
  };
  int i8, t4;
  uint32_t h0, h1, l0, l1;
  if constexpr (kF16) {
    const float pv = tc_piece::split_piece<kFp8>(v, lane, i8, t4, h0, h1, l0, l1);
    put(img_f16, i8, t4, h0, h1, l0, l1);
    if (lane == 0) pinv[size_t(b) * size_t(sh.Mpad) + size_t(m)] = pv;
  }
  if constexpr (kBf16P) {
    tc_piece::split_piece<kBf16>(v, lane, i8, t4, h0, h1, l0, l1);
    put(img_bf16, i8, t4, h0, h1, l0, l1);
  }
}

Shape shape_of(const Plan& p) {
  Shape sh{};
  sh.M = p.M, sh.K = p.K, sh.B = p.B, sh.S = p.S;
  sh.log2S = p.S == 8 ? 3 : p.S == 4 ? 2 : p.S == 2 ? 1 : 0;
  sh.ntok = p.ntok, sh.tiles = p.tiles, sh.ksplit = p.ksplit, sh.Mpad = p.tiles * p.ntok;
  return sh;
}

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

template <int NT, bool kWhole, bool kPair = false>
void launch_main(const Plan& p, const Jobs& jobs, const Shape& sh, const uint8_t* ws, cudaStream_t stream) {
  using C = Cfg<NT>;
  opt_in_dynamic_smem<tc_wg_kernel<NT, kWhole, kPair>>(C::kSmem, true);
  const long long ctas = p.blocks * p.tiles * p.ksplit;
  if (ctas > INT_MAX) throw Error("tc_gemv_f32 (wgmma): launch grid too large");
  launch_pdl(p.M <= 64, tc_wg_kernel<NT, kWhole, kPair>, dim3(unsigned(ctas)), dim3(kThreads), size_t(C::kSmem), stream,
             jobs, sh, ws + p.img_f16, ws + p.img_bf16, reinterpret_cast<const float*>(ws + p.pinv),
             reinterpret_cast<float*>(const_cast<uint8_t*>(ws) + p.partial));
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <bool kGated, bool kF16, bool kBf16P>
void launch_planes(const Plan& p, const Shape& sh, const float* x, const float* u, uint8_t* ws, cudaStream_t stream) {
  const long long units = (long long)p.B * sh.Mpad;
  const long long ctas = (units + kThreads / 32 - 1) / (kThreads / 32);
  if (ctas > INT_MAX) throw Error("tc_gemv_f32 (wgmma): planes grid too large");
  launch_pdl(p.M <= 64, tc_wg_planes_kernel<kGated, kF16, kBf16P>, dim3(unsigned(ctas)), dim3(kThreads), 0, stream, x,
             u, sh, ws + p.img_f16, ws + p.img_bf16, reinterpret_cast<float*>(ws + p.pinv));
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <bool kGated>
void launch_planes_kinds(const Plan& p, const Shape& sh, const float* x, const float* u, uint8_t* ws,
                         cudaStream_t stream) {
  if (p.f16 && p.bf16) launch_planes<kGated, true, true>(p, sh, x, u, ws, stream);
  else if (p.f16) launch_planes<kGated, true, false>(p, sh, x, u, ws, stream);
  else launch_planes<kGated, false, true>(p, sh, x, u, ws, stream);
}

}  // namespace

bool available() {
#if defined(MOESERVE_CUDA_SM90A)
  return current_device_compute_capability() == 90;
#else
  return false;
#endif
}

Plan plan(int M, int K, Jobs& jobs, bool allow_split) {
  Plan p;
  p.M = M, p.K = K;
  p.B = (K + kBK - 1) / kBK;
  p.S = tc_gemv_slices(p.B);
  p.ntok = M <= 16 ? 16 : M <= 32 ? 32 : 64;
  p.tiles = (M + p.ntok - 1) / p.ntok;
  p.blocks = 0;
  for (int i = 0; i < jobs.count; ++i) {
    jobs.job[i].block_begin = int(p.blocks);
    p.blocks += (jobs.job[i].N + kRows - 1) / kRows;
    (jobs.job[i].fmt == kBf16 ? p.bf16 : p.f16) = true;
  }
  // Split K over CTAs while the grid stays within one CTA per SM (the short launches: o_proj /
  // out_proj, the shared expert's down projection, the router set).
  const long long ctas = p.blocks * p.tiles;
  const long long sms = current_device_sm_count();
  p.ksplit = 1;
  while (allow_split && 2 * p.ksplit <= p.S && ctas * 2 * p.ksplit <= sms && ctas <= kMaxArrivals) p.ksplit *= 2;
  const size_t mpad = size_t(p.tiles) * size_t(p.ntok);
  const size_t image = size_t(p.B) * mpad * 512;  // per kind: B·tiles images of 512·NT bytes
  size_t off = 0;
  p.img_f16 = off, off += p.f16 ? round256(image) : 0;
  p.img_bf16 = off, off += p.bf16 ? round256(image) : 0;
  p.pinv = off, off += round256(size_t(p.B) * mpad * 4);
  p.partial = off, off += p.ksplit > 1 ? round256(size_t(ctas) * size_t(p.S) * kRows * size_t(p.ntok) * 4) : 0;
  p.bytes = off;
  return p;
}

size_t reserve_bytes(int max_M, int K) {
  // The largest plan: 64-token tiles, both kinds, and the partials of a split grid (<= SMs / 2 row
  // block x tile pairs of S slices).
  const size_t B = size_t((K + kBK - 1) / kBK), mpad = size_t((max_M + 63) / 64) * 64;
  const size_t sms = size_t(current_device_sm_count());
  return 2 * round256(B * mpad * 512) + round256(B * mpad * 4) + round256((sms / 2 + 1) * 8 * kRows * 64 * 4);
}

void launch(const Plan& p, const Jobs& jobs, const float* x, const float* u, bool gated, uint8_t* ws,
            cudaStream_t stream) {
  if (!available()) throw Error("tc_gemv_f32 (wgmma): needs an sm_90 GPU and a build with sm_90a code");
  if (reinterpret_cast<uintptr_t>(ws) % 16 != 0) throw Error("tc_gemv_f32 (wgmma): workspace not 16-byte aligned");
  const Shape sh = shape_of(p);
  if (gated) launch_planes_kinds<true>(p, sh, x, u, ws, stream);
  else launch_planes_kinds<false>(p, sh, x, u, ws, stream);
  const bool whole = p.K % kBK == 0;
  switch (p.ntok) {
    case 16:
      if (p.blocks * p.tiles * p.ksplit > current_device_sm_count())
        whole ? launch_main<16, true, true>(p, jobs, sh, ws, stream) : launch_main<16, false, true>(p, jobs, sh, ws, stream);
      else
        whole ? launch_main<16, true>(p, jobs, sh, ws, stream) : launch_main<16, false>(p, jobs, sh, ws, stream);
      break;
    case 32:
      whole ? launch_main<32, true>(p, jobs, sh, ws, stream) : launch_main<32, false>(p, jobs, sh, ws, stream);
      break;
    default:
      whole ? launch_main<64, true>(p, jobs, sh, ws, stream) : launch_main<64, false>(p, jobs, sh, ws, stream);
      break;
  }
}

}  // namespace moeserve::cuda::tc_wg
