// Generated tokens' attention on tensor cores (ops_attention_decode_tc.h; paged_attention_generated
// in ops_attention.h is the entry point). mma.sync m16n8k16 bf16 and ldmatrix only (sm_80+: the H200
// and the DGX Spark run the same code), <= 99 KB of shared memory per CTA.
//
// Why: at 64 decode tokens the CUDA-core kernels run ~69 warp instructions per (q head, position)
// (bf16 unpacking, shuffle reductions, f32 FMAs; PERF.md run 26): ~140-180 us per layer for ~34 MB of
// K/V at context 512. Here the 16 q heads of a kv head are one m16 MMA tile, so a K/V row is unpacked
// by the tensor cores for all of them at once.
//
// Data layout. q, gate, out: f32 [M, nq·hd]; q head h reads kv head h / group. KV cache: bf16
// [num_blocks][nkv][block_size][hd], block tables in StepMeta. Workspace (split queries): chunk
// partials acc [M][nq][chunk_stride][hd] and (max, sum) [M][nq][chunk_stride][2], the layout of
// ops_attention.cu's merge kernel, which folds them.
//
// Parallelisation. Two shapes of work item, the same arithmetic. Whole ranges (DecodeTcArgs::
// whole_range, chosen when a step's (token, kv head, head block) triples fill at least half the SMs,
// e.g. 64 decode tokens at the 122B shape): item = token·Y + y, y = kv head · head_blocks + head
// block; the CTA walks all of the token's chunks and folds them in order itself (no workspace, no
// merge, any number of tokens per launch). Chunks (small steps): item = (token t, chunk c, y),
// numbered u·Y + y with u = Σ_{t' < t} nc(t') + c, derived on the device from the tokens' positions
// (the host does not know them when a step is a CUDA-graph replay); a split query's chunk partials
// go to the workspace for the merge kernel; at most 64 tokens per launch. A grid of at most the
// resident CTAs walks the items. CTA = 8 warps at hd >= 128 (4 at hd 64); its MMA rows are the 16 q
// heads (rows past the group are zero padding, never stored). A range is walked in rounds of 64
// positions (two 32-position tiles): each warp copies its share of the round's K and V rows into
// shared memory (cp.async, whole 128-byte lines per warp instruction; positions past the range's
// last visible one zero-filled) and scores those positions (one or two n8 tiles) into a shared S
// buffer; then every warp runs the online softmax of each tile over the whole S (the same operations
// in every warp, so the same values) and P·V for its share of the dims. Whole ranges double-buffer
// the rounds (the next round's copies run under this round's MMAs) where the shared memory allows
// it; the round after those, and the next item's first round, are prefetched into L2.
// Shared memory (bf16 planes row-swizzled as attn_mma::swz): Q hi / lo [16][hd] each, kStages x (K,
// V) [64][hd], S [16][64 + 4] f32: at hd 256 84 KB with one buffer (two CTAs per SM on the H200; the
// DGX Spark's 99 KB), 148 KB with two (the H200's whole ranges, one CTA per SM); 76 KB at hd 128.
//
// Arithmetic (batch invariant: a function of the token's position p, its q / gate rows and the cache):
//   q' = q ⊗ (scale·log2 e), split hi + lo (bf16);
//   chunks as ops_attention.cu (attention_chunks.cuh): C = chunk_size(p + 1), chunk c = [cC, cC + C);
//   inside a chunk, 32-position tiles at fixed offsets from its start, in order, from an empty state:
//   per tile exactly the prefill kernels' tile step (ops_attention_mma_common.cuh: S by the hi / lo
//   MMA chain over the dims in ascending k16 steps, tmax, m', corr, P = ex2.approx(S − m'), l = fma(l,
//   corr, rowsum), O ⊗ corr, O += P·V by hi / lo MMAs), positions > p excluded by selects;
//   the chunk results (m, l, O) folded in chunk order with fold_partial's operations (here for whole
//   ranges and single-chunk queries, else by the merge kernel from the workspace), then out = (O ÷ l)
//   ⊗ sigmoid(gate). An MMA computes each C element from its own A row, B column and old value, so
//   which warp, CTA, launch or step computes a row changes no bit: a token gets the same bits alone,
//   among 63 others, in a verify batch or in a step of more than 64 tokens (launched in groups).
//   The bits differ from the CUDA-core kernels' (other products and tiles), so the model runs every
//   generated token of a configuration through one family (CudaModelOptions::tensor_core_attention).
//
// Roofline (decode, batch 64, context 512, the 122B shapes: hd 256, 2 kv heads x 16 q heads): K and V
// (p+1)·hd·2·2 B per (token, kv head) = 67 MB per layer, ~16 us at 4.3 TB/s (measured 56 us, PERF.md
// session 15: latency-bound, one CTA of 8 warps per SM); MMAs 2 (hi, lo) x 4·hd
// FLOP per (q head, position) = 4.3 GFLOP, ~7 us at mma.sync's ~650 TFLOP/s; Q (16·hd·4 B) and the
// partials ((hd+2)·4 B per q head and chunk, written and read once) through L2.
#include "backend/cuda/ops_attention_decode_tc.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/attention_chunks.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ops_attention_mma_common.cuh"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/smem_opt_in.h"
#include "core/error.h"

namespace moeserve::cuda::detail {
namespace {

using namespace mma_frag;  // split2, ldmatrix, mma_bf16, cp.async
using namespace attn_mma;  // kBc, kSN, swz, tile_softmax, rescale_o, pv_tile, exp2_approx, kLog2e
using attn_chunks::chunk_size;

// Warps per CTA: 8 (one n8 tile of a round's scores and hd/64 dim tiles of O each) where the dims
// split evenly in pairs of n8 tiles, else 4.
template <int kHd>
constexpr int warps_for() {
  return kHd >= 128 ? 8 : 4;
}
constexpr int kHeads = 16;                 // MMA rows: q heads of one kv head per item
constexpr int kRound = 2 * kBc;            // positions per round (two tiles)
constexpr int kSStride = kRound + 4;       // S row stride in floats (+4: the rows' float2 stores spread over banks)
constexpr int kMaxTok = kDecodeTcMaxTokens;
static_assert(attn_chunks::kChunk0 % kRound == 0, "a chunk is whole rounds");

template <int kHd, int kStages>
constexpr size_t smem_bytes() {
  // Q hi / lo planes, kStages x (K, V) rounds, S.
  return size_t(2 * kHeads + kStages * 2 * kRound) * kHd * 2 + size_t(kHeads) * kSStride * 4;
}
static_assert(smem_bytes<256, 1>() <= 99 * 1024, "DGX Spark: <= 99 KB of shared memory per block");
static_assert(smem_bytes<128, 2>() <= 99 * 1024, "DGX Spark: <= 99 KB of shared memory per block");

// One work item (see the file comment).
struct Item {
  int t, pos, kvh, hb, chunk, nc, c0, c_last;
  const int32_t* table;
};

__device__ __forceinline__ Item map_item(const DecodeTcArgs& a, const int* s_first, int M, int Y, int item) {
  Item w;
  const int u = item / Y, y = item - (item / Y) * Y;
  // The token of u: the last t with s_first[t] <= u (s_first increases; s_first[0] = 0).
  int lo = 0, hi = M - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (s_first[mid] <= u) lo = mid;
    else hi = mid - 1;
  }
  w.t = lo;
  w.pos = a.meta.token_pos[lo];
  w.chunk = u - s_first[lo];
  w.kvh = y / a.head_blocks;
  w.hb = y - w.kvh * a.head_blocks;
  const int csize = chunk_size(w.pos + 1);
  w.nc = w.pos / csize + 1;
  w.c0 = w.chunk * csize;
  w.c_last = min(w.c0 + csize, w.pos + 1) - 1;
  w.table = a.meta.block_tables + size_t(a.meta.token_seq[lo]) * a.meta.max_blocks_per_seq;
  return w;
}

// Whole-range item = token·Y + y: every chunk of the token's range.
__device__ __forceinline__ Item whole_item(const DecodeTcArgs& a, int Y, int item) {
  Item w;
  w.t = item / Y;
  const int y = item - w.t * Y;
  w.pos = a.meta.token_pos[w.t];
  w.kvh = y / a.head_blocks;
  w.hb = y - w.kvh * a.head_blocks;
  w.chunk = 0;
  w.nc = attn_chunks::num_chunks(w.pos);
  w.c0 = 0;
  w.c_last = w.pos;
  w.table = a.meta.block_tables + size_t(a.meta.token_seq[w.t]) * a.meta.max_blocks_per_seq;
  return w;
}

// Element offset of position p's row of kv head kvh in the cache.
// Blocks of 2^k positions (the usual 16) take a shift and a mask instead of two divisions.
__device__ __forceinline__ size_t row_offset(const KvCacheView& c, const int32_t* table, int kvh, int p, int hd) {
  const int bs = c.block_size;
  int blk, slot;
  if ((bs & (bs - 1)) == 0) {
    const int sh = __ffs(bs) - 1;
    blk = p >> sh, slot = p & (bs - 1);
  } else {
    blk = p / bs, slot = p - (p / bs) * bs;
  }
  // ((table[blk]·nkv + kvh)·bs + slot)·hd with one wide multiply on the table entry.
  return size_t(unsigned(table[blk])) * (size_t(c.num_kv_heads) * bs * hd) + size_t(unsigned((kvh * bs + slot) * hd));
}

// The rows of positions [p0, p0 + kRows) ∩ [.., p_last] of kv head kvh, one warp's share of a round:
// lane l owns row (l / kPerRow) + kRowsPerStep·i and 16-byte chunk l % kPerRow of it, so a warp
// instruction reads whole 128-byte lines; each lane computes its row offsets (one table lookup per
// row) once, for K and V alike. copy(i, row, off, ok): off the element offset of the lane's chunk
// in row p0 + row (ok: row <= p_last).
template <int kHd, int kRows, class Copy>
__device__ __forceinline__ void for_rows(const KvCacheView& c, const int32_t* table, int kvh, int p0, int p_last,
                                         int lane, Copy&& copy) {
  constexpr int kPerRow = kHd / 8 >= 32 ? 32 : kHd / 8;  // lanes per row (a row is kHd / 8 chunks)
  constexpr int kRowsPerStep = 32 / kPerRow;
  constexpr int kChunkSteps = kHd / 8 / kPerRow;  // chunks per lane and row
  static_assert(kRows % kRowsPerStep == 0, "whole steps");
  const int sub = lane / kPerRow, ch = lane % kPerRow;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerStep; ++i) {
    const int row = sub + kRowsPerStep * i, p = p0 + row;
    const bool ok = p <= p_last;
    const size_t base = ok ? row_offset(c, table, kvh, p, kHd) : 0;
#pragma unroll
    for (int j = 0; j < kChunkSteps; ++j) copy(row, ch + kPerRow * j, base + size_t(ch + kPerRow * j) * 8, ok);
  }
}

// Prefetches K and V of positions [p0, p0 + kRound) ∩ [.., p_last] into L2, a warp's share (rows
// [p0 + share·warp, + share)), one prefetch per 128-byte line.
template <int kHd, int kWarps>
__device__ __forceinline__ void prefetch_round(const KvCacheView& c, const int32_t* table, int kvh, int p0, int p_last,
                                               int warp, int lane) {
  constexpr int kShare = kRound / kWarps;
  for_rows<kHd, kShare>(c, table, kvh, p0 + kShare * warp, p_last, lane, [&](int, int ch, size_t off, bool ok) {
    if (ok && ch % 8 == 0) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(c.k + off));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(c.v + off));
    }
  });
}

// Folds one chunk's (m, l, O) into the running result (FM, FL, FO) of this thread's two rows, in
// chunk order: exactly the operations of the merge kernel's fold_partial (ops_attention.cu), so a
// range folded here has the bits of its chunk partials folded there.
template <int kONw>
__device__ __forceinline__ void fold_chunk(bool& have, float (&FM)[2], float (&FL)[2], float (&FO)[kONw][4],
                                           const float (&m)[2], const float (&l)[2], const float (&o)[kONw][4]) {
  if (!have) {
#pragma unroll
    for (int i = 0; i < 2; ++i) FM[i] = m[i], FL[i] = l[i];
#pragma unroll
    for (int n = 0; n < kONw; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) FO[n][e] = o[n][e];
    have = true;
    return;
  }
  float fa[2], fb[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float nm = fmaxf(FM[i], m[i]);
    fa[i] = exp2_approx(__fsub_rn(FM[i], nm));
    fb[i] = exp2_approx(__fsub_rn(m[i], nm));
    FL[i] = __fmaf_rn(FL[i], fa[i], __fmul_rn(l[i], fb[i]));
    FM[i] = nm;
  }
#pragma unroll
  for (int n = 0; n < kONw; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) FO[n][e] = __fmaf_rn(FO[n][e], fa[e >> 1], __fmul_rn(o[n][e], fb[e >> 1]));
}

// grid: at most the resident CTAs, walking the items blockIdx.x, blockIdx.x + gridDim.x, ... An item is
// (token, kv head, head block) and a range of its chunks: one chunk (a.whole_range == 0: items numbered
// as in the file comment; each chunk's partial goes to the workspace unless the token has one chunk) or
// all of them (a.whole_range: item = token·Y + y, the chunks folded here in order, no workspace, no
// merge). kStages: K / V round buffers (2: the next round's copies run under this round's MMAs).
template <int kHd, int kStages>
__global__ void __launch_bounds__(32 * warps_for<kHd>(), 2) attention_decode_tc_kernel(DecodeTcArgs a) {
  static_assert(kHd % 64 == 0 && kHd <= 256, "head_dim: a multiple of 64 up to 256");
  constexpr int kWarps = warps_for<kHd>();
  constexpr int kONw = kHd / 8 / kWarps;  // n8 dim tiles of O per warp (even: pv_tile's pairs)
  constexpr int kNB = 8 / kWarps;         // n8 tiles of a round's scores per warp (1 or 2)
  constexpr int kShare = kRound / kWarps; // rows of a round each warp copies (= the positions it scores)
  static_assert(kONw % 2 == 0, "pv_tile takes dim tiles in pairs");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* const sq_hi = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sq_lo = sq_hi + kHeads * kHd;
  bf16* const skv = sq_lo + kHeads * kHd;  // [kStages][K | V][kRound][kHd]
  float* const ss = reinterpret_cast<float*>(skv + size_t(kStages) * 2 * kRound * kHd);
  const uint32_t a_qhi = uint32_t(__cvta_generic_to_shared(sq_hi));
  const uint32_t a_qlo = uint32_t(__cvta_generic_to_shared(sq_lo));
  const uint32_t a_kv = uint32_t(__cvta_generic_to_shared(skv));
  constexpr uint32_t kStageBytes = 2u * kRound * kHd * 2u;
  constexpr uint32_t kVOffset = uint32_t(kRound) * kHd * 2u;
  __shared__ int s_first[kMaxTok + 1];  // chunk mode: first u of each token; s_first[M] = Σ nc

  pdl_launch_dependents();  // the merge kernel (PDL) waits for this grid to complete
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int M = a.meta.num_tokens;
  const KvCacheView& cache = a.cache;
  const int Y = a.nkv * a.head_blocks;

  // ---- the item numbering, from the host-written metadata (before the PDL wait) ----
  int items = M * Y;
  if (!a.whole_range) {
    if (warp == 0) {
      const int t0 = 2 * lane, t1 = 2 * lane + 1;
      const int n0 = t0 < M ? attn_chunks::num_chunks(a.meta.token_pos[t0]) : 0;
      const int n1 = t1 < M ? attn_chunks::num_chunks(a.meta.token_pos[t1]) : 0;
      int incl = n0 + n1;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      s_first[t0] = incl - n0 - n1;
      s_first[t1] = incl - n1;
      if (lane == 31) s_first[kMaxTok] = incl;
    }
    __syncthreads();
    items = s_first[kMaxTok] * Y;  // tokens >= M add no chunks
  }
  auto item_of = [&](int item) {
    return a.whole_range ? whole_item(a, Y, item) : map_item(a, s_first, M, Y, item);
  };

  // The first item's first round into L2 while the previous kernel (attention_prepare, which writes
  // the new rows) finishes: L2 is the point of coherence, so a prefetched line is never stale.
  if (int(blockIdx.x) < items) {
    const Item w = item_of(int(blockIdx.x));
    prefetch_round<kHd, kWarps>(cache, w.table, w.kvh, w.c0, w.c_last, warp, lane);
  }
  pdl_wait();  // q, gate and the new K / V rows are written by attention_prepare

  // Per-lane ldmatrix coordinates (the prefill kernels' fragment layouts, attn_mma).
  const int qa_row = (lane & 7) + ((lane >> 3) & 1) * 8, qa_chunk = lane >> 4;              // Q (A, x4)
  const int kb_row = kShare * warp + (lane >> 4) * 8 + (lane & 7), kb_chunk = (lane >> 3) & 1;  // K (B)
  const int vb_row = ((lane >> 3) & 1) * 8 + (lane & 7), vb_chunk = lane >> 4;              // V (B, x4.trans)

  for (int item = int(blockIdx.x); item < items; item += int(gridDim.x)) {
    const Item w = item_of(item);
    const int head0 = w.kvh * a.group + w.hb * kHeads;      // the item's first q head
    const int heads = min(kHeads, a.group - w.hb * kHeads);  // valid rows
    {  // the next item's first round into L2
      const int nx = item + int(gridDim.x);
      if (nx < items) {
        const Item n = item_of(nx);
        prefetch_round<kHd, kWarps>(cache, n.table, n.kvh, n.c0, n.c_last, warp, lane);
      }
    }
    __syncthreads();  // the previous item's readers of the Q planes, K, V and S are done

    // ---- Q: f32 -> ·scale·log2e -> hi / lo planes ----
#pragma unroll
    for (int i = 0; i < kHeads * (kHd / 4) / (32 * kWarps); ++i) {
      const int c = tid + i * 32 * kWarps;
      const int r = c / (kHd / 4), d = (c % (kHd / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < heads) v = __ldcg(reinterpret_cast<const float4*>(a.q + (size_t(w.t) * a.nq + head0 + r) * kHd + d));
      uint2 hi, lo;
      split2(__fmul_rn(v.x, a.scale_log2), __fmul_rn(v.y, a.scale_log2), hi.x, lo.x);
      split2(__fmul_rn(v.z, a.scale_log2), __fmul_rn(v.w, a.scale_log2), hi.y, lo.y);
      const int off = swz<kHd>(r, d >> 3) + (d & 7);
      *reinterpret_cast<uint2*>(sq_hi + off) = hi;
      *reinterpret_cast<uint2*>(sq_lo + off) = lo;
    }

    // Round k of the item: positions [w.c0 + 64k, + 64) ∩ [.., w.c_last] (rows past c_last zero-filled,
    // never read from the cache), K then V, into stage k % kStages.
    const int n_rounds = (w.c_last - w.c0) / kRound + 1;
    auto issue_round = [&](int k) {
      const int r0 = w.c0 + k * kRound + kShare * warp;  // this warp's rows of round k
      const uint32_t st = a_kv + uint32_t(k % kStages) * kStageBytes;
      for_rows<kHd, kShare>(cache, w.table, w.kvh, r0, w.c_last, lane, [&](int row, int ch, size_t off, bool ok) {
        const uint32_t dst = st + uint32_t(swz<kHd>(kShare * warp + row, ch)) * 2u;
        cp_async16(dst, cache.k + off, ok ? 16 : 0);
        cp_async16(dst + kVOffset, cache.v + off, ok ? 16 : 0);
      });
      cp_async_commit();
    };

    float o[kONw][4];
    float m_run[2], l_run[2];
    float FO[kONw][4], FM[2] = {0.f, 0.f}, FL[2] = {0.f, 0.f};  // the folded chunks (whole range)
    bool have = false;
    int csize = chunk_size(w.pos + 1);
    issue_round(0);
    for (int k = 0; k < n_rounds; ++k) {
      const int r0 = w.c0 + k * kRound;
      if (r0 % csize == 0 || k == 0) {  // a chunk starts: empty state
        zero_fragments(o);
        m_run[0] = m_run[1] = -INFINITY;
        l_run[0] = l_run[1] = 0.f;
      }
      if (kStages > 1) {
        __syncthreads();  // every warp is done with round k - 1 (its stage is free) and with S
        if (k + 1 < n_rounds) issue_round(k + 1);
        else cp_async_commit();  // an empty group keeps the count uniform
        cp_async_wait<1>();      // round k has landed (this thread's copies)
      } else {
        if (k > 0) {
          __syncthreads();  // every warp is done with round k - 1
          issue_round(k);
        }
        cp_async_wait<0>();
      }
      if (k + kStages < n_rounds)  // the first round not yet copied into L2
        prefetch_round<kHd, kWarps>(cache, w.table, w.kvh, r0 + kStages * kRound, w.c_last, warp, lane);
      __syncthreads();  // everyone's copies of round k, and the Q planes
      const uint32_t a_k = a_kv + uint32_t(k % kStages) * kStageBytes, a_v = a_k + kVOffset;
      const int nt = min(2, (w.c_last - r0) / kBc + 1);  // tiles of the round with a visible position

      // ---- S of positions [kShare·warp, + kShare) of the round: the qk_tile chain per n8 tile ----
      if (kShare * warp < nt * kBc) {  // warp-uniform
        float s2[kNB][4];
        zero_fragments(s2);
#pragma unroll 4
        for (int ks = 0; ks < kHd / 16; ++ks) {
          uint32_t ah[4], al[4], r4[4];
          const uint32_t qoff = uint32_t(swz<kHd>(qa_row, 2 * ks + qa_chunk)) * 2u;
          ldmatrix_x4(a_qhi + qoff, ah);
          ldmatrix_x4(a_qlo + qoff, al);
          if constexpr (kNB == 2) {
            ldmatrix_x4(a_k + uint32_t(swz<kHd>(kb_row, 2 * ks + kb_chunk)) * 2u, r4);
          } else {  // x2: lanes 0-15 address (pos 0-7, k 0-7), (pos 0-7, k 8-15); the others mirror them
            uint32_t r2[2];
            ldmatrix_x2(a_k + uint32_t(swz<kHd>(kShare * warp + (lane & 7), 2 * ks + ((lane >> 3) & 1))) * 2u, r2);
            r4[0] = r2[0], r4[1] = r2[1];
          }
#pragma unroll
          for (int n = 0; n < kNB; ++n) mma_bf16(s2[n], ah, r4[2 * n], r4[2 * n + 1]);
#pragma unroll
          for (int n = 0; n < kNB; ++n) mma_bf16(s2[n], al, r4[2 * n], r4[2 * n + 1]);
        }
#pragma unroll
        for (int n = 0; n < kNB; ++n) {
          const int col = kShare * warp + 8 * n + 2 * tq;
          *reinterpret_cast<float2*>(ss + g * kSStride + col) = make_float2(s2[n][0], s2[n][1]);
          *reinterpret_cast<float2*>(ss + (g + 8) * kSStride + col) = make_float2(s2[n][2], s2[n][3]);
        }
      }
      __syncthreads();  // S complete

      // ---- per tile in order: online softmax over all 32 positions, P·V for this warp's dims ----
      for (int tau = 0; tau < nt; ++tau) {
        const int t0 = r0 + tau * kBc;
        float s[kSN][4];
#pragma unroll
        for (int n = 0; n < kSN; ++n) {
          const int col = tau * kBc + 8 * n + 2 * tq;
          const float2 x0 = *reinterpret_cast<const float2*>(ss + g * kSStride + col);
          const float2 x1 = *reinterpret_cast<const float2*>(ss + (g + 8) * kSStride + col);
          s[n][0] = x0.x, s[n][1] = x0.y, s[n][2] = x1.x, s[n][3] = x1.y;
        }
        float corr[2];
        tile_softmax(s, m_run, l_run, corr, [&](int, int n, int c) { return t0 + 8 * n + 2 * tq + c <= w.pos; });
        rescale_o(o, corr);
        pv_tile(o, s, [&](int ks, int dp) {
          return a_v + uint32_t(swz<kHd>(tau * kBc + 16 * ks + vb_row, 2 * (warp * (kONw / 2) + dp) + vb_chunk)) * 2u;
        });
      }
      const bool chunk_end = r0 + kRound > w.c_last || (r0 + kRound) % csize == 0;
      if (!chunk_end) continue;
      if (a.whole_range) {
        fold_chunk(have, FM, FL, FO, m_run, l_run, o);
        continue;
      }
      // Chunk mode: the token's only chunk is its output (as folded alone); else the partial.
      if (w.nc == 1) {
        fold_chunk(have, FM, FL, FO, m_run, l_run, o);
        continue;
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = g + 8 * i;
        if (r >= heads) continue;
        const size_t slot = (size_t(w.t) * a.nq + head0 + r) * a.chunk_stride + w.chunk;
        if (warp == 0 && tq == 0) *reinterpret_cast<float2*>(a.ws_ml + slot * 2) = make_float2(m_run[i], l_run[i]);
#pragma unroll
        for (int n = 0; n < kONw; ++n) {
          const int d = 8 * (warp * kONw + n) + 2 * tq;
          *reinterpret_cast<float2*>(a.ws_acc + slot * kHd + d) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
        }
      }
    }
    if (!have) continue;  // chunk mode, a split token: the merge kernel writes the output

    // ---- out = FO / FL · sigmoid(gate) (the merge kernel's gated_output) ----
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = g + 8 * i;
      if (r >= heads) continue;
      const size_t oh = size_t(w.t) * a.nq + head0 + r;  // token·nq + q head
      const float L = FL[i];
#pragma unroll
      for (int n = 0; n < kONw; ++n) {
        const int d = 8 * (warp * kONw + n) + 2 * tq;
        const float2 gv = __ldcg(reinterpret_cast<const float2*>(a.gate + oh * kHd + d));
        const float s0 = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp2_approx(__fmul_rn(-gv.x, kLog2e))));
        const float s1 = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp2_approx(__fmul_rn(-gv.y, kLog2e))));
        *reinterpret_cast<float2*>(a.out + oh * kHd + d) =
            make_float2(__fmul_rn(__fdiv_rn(FO[n][2 * i], L), s0), __fmul_rn(__fdiv_rn(FO[n][2 * i + 1], L), s1));
      }
    }
  }
  cp_async_wait<0>();
}

// Resident CTAs per SM of each instance on the current device (set up once; 0: not yet).
template <int kHd, int kStages>
int& ctas_per_sm() {
  static int n = 0;
  return n;
}

template <int kHd, int kStages>
int setup() {
  int& n = ctas_per_sm<kHd, kStages>();
  if (n > 0) return n;
  constexpr size_t smem = smem_bytes<kHd, kStages>();
  if constexpr (smem > 48 * 1024) opt_in_dynamic_smem<attention_decode_tc_kernel<kHd, kStages>>(smem, true);
  int k = 0;
  MOESERVE_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k, attention_decode_tc_kernel<kHd, kStages>, 32 * warps_for<kHd>(), smem));
  n = std::max(1, k);
  return n;
}

// Whether the device gives a CTA the double-buffered rounds' shared memory.
template <int kHd>
bool two_stages_fit() {
  static const bool fit = [] {
    int dev = 0, optin = 0;
    MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return size_t(optin) >= smem_bytes<kHd, 2>();
  }();
  return fit;
}

template <int kHd, int kStages>
void launch_stages(const DecodeTcArgs& a, size_t max_items, cudaStream_t stream) {
  const size_t cap = size_t(current_device_sm_count()) * size_t(setup<kHd, kStages>());
  const unsigned grid = unsigned(std::max<size_t>(1, std::min(max_items, cap)));
  launch_pdl(true, attention_decode_tc_kernel<kHd, kStages>, dim3(grid), dim3(32 * warps_for<kHd>()), smem_bytes<kHd, kStages>(),
             stream, a);
}

// Whole ranges walk several rounds: double-buffered where the shared memory allows. Chunk items
// are one round up to contexts of 4096: one buffer, more CTAs per SM.
template <int kHd>
void launch(const DecodeTcArgs& a, size_t max_items, cudaStream_t stream) {
  if (a.whole_range && two_stages_fit<kHd>()) launch_stages<kHd, 2>(a, max_items, stream);
  else launch_stages<kHd, 1>(a, max_items, stream);
}

template <int kHd>
void prepare_hd() {
  setup<kHd, 1>();
  if (two_stages_fit<kHd>()) setup<kHd, 2>();
}

}  // namespace

bool attention_decode_tc_supported(const AttentionShape& s) {
  return (s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256) && s.num_kv_heads > 0 && s.num_q_heads > 0 &&
         s.num_q_heads % s.num_kv_heads == 0;
}

void attention_decode_tc_prepare() {
  prepare_hd<64>();
  prepare_hd<128>();
  prepare_hd<256>();
}

bool attention_decode_tc_whole_ranges(int tokens, int kv_heads, int head_blocks) {
  return 2LL * tokens * kv_heads * head_blocks >= current_device_sm_count();
}

void attention_decode_tc(const DecodeTcArgs& a, int head_dim, size_t max_items, cudaStream_t stream) {
  if (a.meta.num_tokens <= 0) return;
  if (!a.whole_range && a.meta.num_tokens > kMaxTok)
    throw Error("attention (tensor-core decode): at most " + std::to_string(kMaxTok) + " tokens per launch, got " +
                std::to_string(a.meta.num_tokens));
  switch (head_dim) {
    case 64: launch<64>(a, max_items, stream); break;
    case 128: launch<128>(a, max_items, stream); break;
    case 256: launch<256>(a, max_items, stream); break;
    default: throw Error("attention (tensor-core decode): head_dim must be 64, 128 or 256, got " + std::to_string(head_dim));
  }
}

}  // namespace moeserve::cuda::detail
