// Gated attention kernels (ops_attention.h).
//
// attention_prepare_kernel: one warp per (token, head), heads = q heads then kv heads, 4 warps
//   per CTA, so a step of M tokens runs M·(nq+nkv) independent warps. Lane i holds dims
//   i, i+32, ... (head_dim <= 256). A warp's arithmetic depends only on its own token.
//   Roofline: reads qg (2·nq·hd) and k, v (2·nkv·hd) once, writes q, gate (2·nq·hd) and the
//   two cache rows (2·nkv·hd bf16) per token. In steps of <= 64 tokens it is a programmatic
//   dependent launch (reads the metadata, then waits for the projection kernel) and lets the
//   decode attention kernel launch at once.
//
// paged_attention_kernel: one CTA per (query tile, kv head [, q-head block], KV split).
//   A query tile is up to Q consecutive tokens of one sequence; the CTA's rows are
//   (token, q head) pairs of that tile over the q heads of its kv head (GQA group), two rows
//   per warp. Each K/V tile of kTile positions is copied once into shared memory (cp.async,
//   kStages-deep pipeline, layout [stage][K|V][kTile][hd] bf16) and serves every row of the
//   CTA, so K/V leave L2/HBM once per (tile of tokens, kv head) instead of once per q head.
//   Per row, lane l owns dims 8l..8l+7: q·K partial dots over those dims, a butterfly
//   reduce-scatter leaves the score of position (l & 15) on lane l, then an online softmax
//   (exp2 domain: q is pre-scaled by scale·log2 e) and acc += e·V over the lane's dims.
//   Roofline (decode): per token and kv head (pos+1)·hd·2·2 B of K/V, plus q, gate, out;
//   prefill tiles divide that by Q. Split partials add (hd+2)·4 B per (token, q head, chunk),
//   written once and read once by the merge kernel.
// attention_merge_kernel: one warp per (token, q head) whose KV range has several chunks;
//   folds the chunk partials in chunk order and applies the output gate.
//   These two serve steps with prompt tokens (the fallback for head_dims the tensor-core
//   kernel lacks), verify batches, decode steps of more than 64 tokens, and decode steps
//   whose workspace is too small.
//
// paged_attention_decode2_kernel (the tile-parallel decode kernel): decode steps of <= 2
//   tokens under the default decode variant (<= 8 under variant 2; set_attention_decode_variant:
//   faster at one token, slower than the work-item kernel at eight), with cache blocks
//   of 2^k positions and head dims of 8·2^k (no integer divisions on the copy paths). Work item = (token,
//   chunk of its range, kv head, head block of 4 q heads); 16 warps, warp (head slot, tile slot);
//   a grid of at most the resident CTAs (one per SM) walks the items, numbered as for the
//   work-item kernel below, so a lone decode at context 512 (9 chunks x 2 kv heads x 4 head
//   blocks) runs 72 CTAs of one item each. A chunk goes in rounds of 4 tiles (64 positions; one
//   round for contexts up to 4096): the round's K and V rows are copied at once (one cp.async
//   group, [K|V][64][hd] bf16 = 64 KB of shared memory at hd 256, opted in; where two rounds fit,
//   as on the H200, the CTA's next round is copied into a second buffer while this one is used:
//   set_attention_decode_stages) while the rows of the CTA's rounds two ahead are prefetched into
//   L2; each warp scores one tile
//   for one head; the tile maxima are exchanged in shared memory so that each warp forms the
//   running maximum (a prefix of exact fmaxf) and its tile's weights; then each head's four warps
//   run the serial online-softmax update over the round's tiles in order, each for a quarter of
//   the head's dims (two per lane). The critical path of a chunk is one copy round trip, one tile
//   of scores and a 16-FMA-per-position chain, where the work-item kernel has a pipelined
//   score + accumulate step per tile. Chunk partials go to the workspace; the last of a (token,
//   kv head, head block)'s chunk CTAs to finish (an arrival count per group in a __device__
//   array that the last arrival sets back to zero) folds them in chunk order and writes the
//   output: no merge launch. Roofline as the work-item kernel (each K/V row leaves HBM once per
//   (token, kv head): the 4 head blocks of a chunk read it side by side, from L2 after the
//   first), plus the partials through L2.
//   With prep (paged_attention_generated_prepared: steps of generated tokens, no attention_prepare
//   launch), each item also does attention_prepare's work for itself, with its device function
//   (norm_rope) and lane layout, so the same bits: warp (head slot, 0) normalises and rotates the
//   slot's q head from q_proj's output into shared memory; in the token's last chunk warp (0, 1)
//   forms the new K row (and takes the V row), which the round holding the token's position puts
//   into its shared-memory copy (that row is never copied from the cache: no kernel has written it
//   yet) and the head block 0 CTA writes to the cache; the gate is read from q_proj's output.
//
// paged_attention_decode_kernel (the work-item kernel): decode steps (one token per sequence) of
//   <= 64 tokens, the generated tokens of the model (those of > 8 tokens, and all under decode
//   variant 0). Work item = (token, chunk of its range, kv head, head
//   block of H = 4, 8 or 16 q heads of the group); a grid of at most the resident CTAs walks
//   the items (numbered from the tokens' positions on the device: the host does not know the
//   contexts), so a lone decode at context 512 (9 chunks x 2 kv heads x 2 head blocks) runs
//   36 CTAs, each 4 tiles long, and long contexts fill every SM. Layout: K/V stages
//   [kStages][K|V][kTile][hd] bf16 (48 KB at hd 256); one row (q head) per warp in steps of
//   <= 4 tokens and for groups <= 4, else two rows per warp sharing each K/V vector read from
//   shared memory (fewer instructions per score). Chunk partials [M][nq][chunk][hd] and
//   (max, sum) in the workspace, folded by attention_merge_kernel. Both kernels are
//   programmatic dependent launches (attention_prepare -> decode -> merge): each starts while
//   its predecessor runs, reads the host-written step metadata (and the decode kernel starts
//   copying its first K/V tiles, all but the one holding the token's own new row), then waits
//   for it: the launch latency and those round trips leave the critical path. Roofline: K and V
//   of the context read from HBM once per (token, kv head), (pos+1)·hd·2·2 B (the head blocks
//   of one chunk run side by side and share it in L2), plus q, gate, out (3·nq·hd·4 B) and
//   per chunk after the first 2·(hd+2)·4 B per q head of partials. Per score and row: 8 FMAs
//   per lane for q·k and 8 for e·v; everything else (bf16 unpacking, shuffles, exp2) is
//   shared by the 16 positions of a tile or the rows of a warp, so long contexts are bound by
//   the FMA issue rate (16 FMA instructions per (q head, position) per warp) about as much
//   as by HBM.
//
// Batch invariance. The arithmetic of one query is a function of its position p alone:
//   * the visible range [0, p] is cut into chunks of chunk_size(p+1) positions (kChunk0,
//     doubled while there would be more than 64 chunks), chunk c = [c·C, (c+1)·C);
//   * inside a chunk, an online softmax over kTile-aligned tiles in increasing order,
//     starting empty at the chunk's first tile; positions > p are excluded by selects, never
//     by arithmetic on masked values;
//   * chunk partials (max, sum, acc) are folded in chunk order by fold_partial, then
//     acc / sum · sigmoid(gate).
//   Whether a chunk's partial is folded in registers (one CTA walks the whole range) or goes
//   through the workspace and the merge kernel or the tile-parallel kernel's last CTA (the
//   range is split over CTAs), whether a chunk's tiles are scored one after the other or side by
//   side (the running maximum is a prefix of fmaxf, exact in any grouping; the sum and the
//   per-dim multiply-add chain stay serial in position order), and which lane or warp holds a
//   dim, change where the numbers live, not the operations: every floating-point step is an explicit
//   round-to-nearest intrinsic (__fmaf_rn, __fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn) or
//   ex2.approx, so the compiler cannot contract or reorder differently in different kernels,
//   template instances or row slots. Tile size, warp count, split count and the tokens that
//   share a CTA are therefore free choices of the launcher, and the decode kernel (one chunk
//   per work item) gives the same bits as the tile kernel.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <string>

#include "backend/cuda/act_types.cuh"
#include "backend/cuda/attention_chunks.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/l2_prefetch.cuh"
#include "backend/cuda/ops_attention.h"
#include "backend/cuda/ops_attention_decode_tc.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/stage_stamps.cuh"

namespace moeserve::cuda {
namespace {

using attn_chunks::chunk_size;
using attn_chunks::kChunk0;
using attn_chunks::kMaxChunks;
using attn_chunks::num_chunks;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ size_t cache_offset(const KvCacheView& c, int block, int head, int slot) {
  return ((size_t(block) * c.num_kv_heads + head) * c.block_size + slot) * size_t(c.head_dim);
}

// ---- attention_prepare ------------------------------------------------------------------

constexpr int kPrepWarps = 4;
constexpr int kPrepPdlMaxTokens = 64;  // steps of at most this many tokens launch it with PDL

// RMSNorm (1+w) over hd values held by a warp (lane i holds dims i, i+32, ...), then NeoX
// RoPE on the first rotary_dim dims. vals: this lane's values; row: the warp's 256-float
// scratch for exchanging rotation partners (pair (d, d + rot/2) for d < rot/2).
__device__ void norm_rope(float* vals, int hd, const float* w, float eps, const float* inv_freq, int rot, int pos,
                          float* row) {
  const int lane = threadIdx.x & 31;
  float ss = 0.0f;
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) ss += vals[i] * vals[i];
  }
  const float inv = rsqrtf(warp_sum(ss) / float(hd) + eps);
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) vals[i] = vals[i] * inv * (1.0f + w[d]);
  }
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) row[d] = vals[i];
  }
  __syncwarp();
  const int half = rot / 2;
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < rot) {
      const int j = d < half ? d : d - half;
      float sn, cs;
      sincosf(float(pos) * inv_freq[j], &sn, &cs);
      const float x = row[d];
      const float partner = d < half ? -row[d + half] : row[d - half];
      vals[i] = x * cs + partner * sn;
    }
  }
  __syncwarp();
}

template <typename T>
__global__ void __launch_bounds__(kPrepWarps * 32)
    attention_prepare_kernel(const T* __restrict__ qg, const T* __restrict__ k, const T* __restrict__ v,
                             const float* q_norm_w, const float* k_norm_w, const float* inv_freq, AttentionShape s,
                             StepMeta meta, KvCacheView cache, T* q_out, T* gate_out) {
  __shared__ float rope_buf[kPrepWarps][32 * kMaxDimsPerLane];
  pdl_launch_dependents();  // the decode attention kernel (PDL) waits for this grid to complete
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nh = s.num_q_heads + s.num_kv_heads;
  const long long item = (long long)blockIdx.x * kPrepWarps + warp;
  if (item >= (long long)meta.num_tokens * nh) return;  // warp-uniform; only __syncwarp below
  const int m = int(item / nh), h = int(item % nh);
  const int hd = s.head_dim;
  // The step metadata (a host copy) before the wait; qg, k, v come from the projection kernel.
  const int pos = meta.token_pos[m];
  const int block = h < s.num_q_heads ? 0
                                      : meta.block_tables[size_t(meta.token_seq[m]) * meta.max_blocks_per_seq +
                                                          pos / cache.block_size];
  pdl_wait();
  float vals[kMaxDimsPerLane];
  if (h < s.num_q_heads) {
    const T* src = qg + size_t(m) * s.num_q_heads * 2 * hd + size_t(h) * 2 * hd;
    T* q_dst = q_out + size_t(m) * s.num_q_heads * hd + size_t(h) * hd;
    T* g_dst = gate_out + size_t(m) * s.num_q_heads * hd + size_t(h) * hd;
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      vals[i] = d < hd ? to_f32(src[d]) : 0.0f;
      if (d < hd) g_dst[d] = src[hd + d];
    }
    norm_rope(vals, hd, q_norm_w, s.rms_eps, inv_freq, s.rotary_dim, pos, rope_buf[warp]);
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) q_dst[d] = from_f32<T>(vals[i]);
    }
  } else {
    const int kh = h - s.num_q_heads;
    const int slot = pos % cache.block_size;
    const T* src = k + size_t(m) * s.num_kv_heads * hd + size_t(kh) * hd;
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      vals[i] = d < hd ? to_f32(src[d]) : 0.0f;
    }
    norm_rope(vals, hd, k_norm_w, s.rms_eps, inv_freq, s.rotary_dim, pos, rope_buf[warp]);
    const size_t off = cache_offset(cache, block, kh, slot);
    const T* vsrc = v + size_t(m) * s.num_kv_heads * hd + size_t(kh) * hd;
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) {
        cache.k[off + d] = __float2bfloat16(vals[i]);
        cache.v[off + d] = __float2bfloat16(to_f32(vsrc[d]));
      }
    }
  }
}

// ---- paged attention: shared pieces -----------------------------------------------------

constexpr int kTile = 16;           // KV positions per shared-memory tile (reduce-scatter width)
constexpr int kStages = 3;          // cp.async pipeline depth
constexpr int kRowsPerWarp = 2;     // (token, q head) rows per warp; they share each K/V load
constexpr int kLaneDims = 8;        // dims per lane: one 16-byte bf16 vector
constexpr int kSplitMaxTokens = 64;  // steps of at most this many tokens may split over CTAs
constexpr int kMergeWarps = 4;
constexpr size_t kMaxSmem = size_t(kStages) * 2 * kTile * 32 * kLaneDims * sizeof(bf16);
static_assert(kMaxSmem <= 48 * 1024, "attention tile pipeline must fit the default 48 KB of shared memory");
static_assert(kChunk0 % kTile == 0, "chunks are whole tiles");
static_assert(kTile == 16, "reduce_scatter16 and the half-warp reductions assume 16-position tiles");

// log2 of a power of two.
__device__ __forceinline__ int log2_pow2(int x) { return __ffs(x) - 1; }

// Launch parameters chosen on the host (none of them changes a query's arithmetic).
struct AttnLaunch {
  int tile_tokens;    // Q: tokens of one sequence per CTA
  int heads_per_cta;  // q heads of the kv head's group per CTA
  int head_blocks;    // ceil(group / heads_per_cta)
  int splits;         // CTAs over each query tile's chunk list (grid.z); > 1: partials + merge
  int chunk_stride;   // chunk slots per (token, q head) in the workspace
  float scale_log2;   // softmax scale · log2(e)
  bool fold_in_kernel;  // tile-parallel decode kernel: its last CTA per (token, kv head, head block) folds
  int stages;           // tile-parallel decode kernel: K/V rounds in shared memory (2: the next one in flight)
  float* ws_acc;      // [M][nq][chunk_stride][hd] unnormalised partial outputs
  float* ws_ml;       // [M][nq][chunk_stride][2] partial (max, sum), exp2 domain
};

// attention_prepare's inputs, for the tile-parallel decode kernel that does its work itself
// (paged_attention_generated_prepared); qg null: attention_prepare has run (q, gate and the cache
// rows are written).
template <typename T>
struct PrepIn {
  const T* qg;  // [M][nq][query | gate][hd]
  const T* k;   // [M][nkv][hd]
  const T* v;
  const float* q_norm_w;
  const float* k_norm_w;
  const float* inv_freq;
};

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 8 bf16 (16 bytes) -> 8 floats (exact).
__device__ __forceinline__ void load_bf16x8(const bf16* p, float* f) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Reduce-scatter of 16 per-lane partial sums over the warp: afterwards every lane l holds
// Σ_lanes v[l & 15] (lanes l and l^16 the same value). Butterfly over lane bits 3..0 (each
// step keeps the half of the values selected by the lane's bit and adds the partner's copy
// of it), then one exchange across the two half-warps. The addition tree of each position is
// fixed, so the result depends only on the inputs.
template <int O>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[kTile], int lane) {
  const bool up = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = up ? v[i] : v[i + O];
    const float keep = up ? v[i + O] : v[i];
    v[i] = __fadd_rn(keep, __shfl_xor_sync(kFull, send, O));
  }
}
__device__ __forceinline__ float reduce_scatter16(float (&v)[kTile], int lane) {
  reduce_scatter_step<8>(v, lane);
  reduce_scatter_step<4>(v, lane);
  reduce_scatter_step<2>(v, lane);
  reduce_scatter_step<1>(v, lane);
  return __fadd_rn(v[0], __shfl_xor_sync(kFull, v[0], 16));
}

// Max / sum over the 16 lanes of each half-warp (both halves hold the same values). Every
// lane ends with the same, bit-identical result (a + b == b + a).
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int o = 8; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int o = 8; o >= 1; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Folds one chunk partial (m, l, acc) into the running result (M, L, ACC), in chunk order.
// The first partial is taken as is. Used by the main kernel and by the merge kernel alike.
__device__ __forceinline__ void fold_partial(float& M, float& L, float* ACC, bool& have, float m, float l,
                                             const float* acc) {
  if (!have) {
    M = m;
    L = l;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) ACC[i] = acc[i];
    have = true;
    return;
  }
  const float nm = fmaxf(M, m);
  const float a = exp2_approx(__fsub_rn(M, nm)), b = exp2_approx(__fsub_rn(m, nm));
  L = __fmaf_rn(L, a, __fmul_rn(l, b));
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) ACC[i] = __fmaf_rn(ACC[i], a, __fmul_rn(acc[i], b));
  M = nm;
}

// out[d] = ACC[d] / L · sigmoid(gate[d]) for the lane's dims. kL2: gate through L2 only (for
// dependent launches, which may have started before gate was written).
// One output value: acc / L · sigmoid(g), with the same operations on every path.
__device__ __forceinline__ float gated_output(float acc, float L, float g) {
  const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp2_approx(__fmul_rn(-g, kLog2e))));
  return __fmul_rn(__fdiv_rn(acc, L), sig);
}

template <bool kL2 = false, typename T>
__device__ __forceinline__ void store_output(const float* ACC, float L, const T* gate_row, T* out_row, int lane,
                                             int hd) {
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) {
    const int d = kLaneDims * lane + i;
    if (d < hd) {
      const float g = to_f32(kL2 ? __ldcg(gate_row + d) : gate_row[d]);
      out_row[d] = from_f32<T>(gated_output(ACC[i], L, g));
    }
  }
}

// ---- per-row arithmetic shared by the main and decode kernels -----------------------------
// Both kernels call these for every tile, so a row's operations and their order are the same
// on either path (bit-identical results).

// The lane's kLaneDims dims of row j of a K or V tile in shared memory (zeros for lanes past
// head_dim).
__device__ __forceinline__ void load_lane_dims(const bf16* tile, int j, int hd, int lane, bool has_dims,
                                               float (&f)[kLaneDims]) {
  if (has_dims) {
    load_bf16x8(tile + size_t(j) * hd + kLaneDims * lane, f);
  } else {
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) f[i] = 0.0f;
  }
}

// Score partials of kR rows over a K tile: part[r][j] = Σ_i qv[r][i]·K_j[i] over the lane's
// dims, one multiply then fused multiply-adds in dim order (reduce_scatter16 finishes them).
template <int kR>
__device__ __forceinline__ void tile_score_partials(const bf16* Ks, int hd, int lane, bool has_dims,
                                                    const float (&qv)[kR][kLaneDims], float (&part)[kR][kTile]) {
#pragma unroll
  for (int j = 0; j < kTile; ++j) {
    float kf[kLaneDims];
    load_lane_dims(Ks, j, hd, lane, has_dims, kf);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float a = __fmul_rn(qv[r][0], kf[0]);
#pragma unroll
      for (int i = 1; i < kLaneDims; ++i) a = __fmaf_rn(qv[r][i], kf[i], a);
      part[r][j] = a;
    }
  }
}

// Empty running state of a row (start of a chunk).
__device__ __forceinline__ void reset_running(float& run_m, float& run_l, float (&run_acc)[kLaneDims]) {
  run_m = -INFINITY;
  run_l = 0.0f;
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) run_acc[i] = 0.0f;
}

// Online-softmax update of one row for a tile (exp2 domain): sc is the score of the lane's
// position t0 + (lane & 15), valid whether that position is visible (position t0 always is,
// so the new max is finite). Rescales the running (max, sum, acc) and returns the lane's
// weight e = 2^(sc - new max) (0 when not valid).
__device__ __forceinline__ float online_softmax_step(float sc, bool valid, float& run_m, float& run_l,
                                                     float (&run_acc)[kLaneDims]) {
  const float tmax = half_warp_max(valid ? sc : -INFINITY);
  const float nm = fmaxf(run_m, tmax);  // finite: position t0 is valid
  const float corr = exp2_approx(__fsub_rn(run_m, nm));
  const float e = valid ? exp2_approx(__fsub_rn(sc, nm)) : 0.0f;
  run_l = __fmaf_rn(run_l, corr, half_warp_sum(e));
  run_m = nm;
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) run_acc[i] = __fmul_rn(run_acc[i], corr);
  return e;
}

// acc += e_j · V_j for the tile's position j (e: the row's weights, position j on lane j).
__device__ __forceinline__ void accumulate_ev(float e, int j, const float (&vf)[kLaneDims],
                                              float (&run_acc)[kLaneDims]) {
  const float ej = __shfl_sync(kFull, e, j);
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) run_acc[i] = __fmaf_rn(ej, vf[i], run_acc[i]);
}

// A chunk partial (max, sum, acc) of one row into workspace slot `slot` for
// attention_merge_kernel.
__device__ __forceinline__ void store_partial(const AttnLaunch& L, size_t slot, int hd, int lane, float run_m,
                                              float run_l, const float (&run_acc)[kLaneDims]) {
  if (lane == 0) {
    L.ws_ml[slot * 2] = run_m;
    L.ws_ml[slot * 2 + 1] = run_l;
  }
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) {
    const int d = kLaneDims * lane + i;
    if (d < hd) L.ws_acc[slot * hd + d] = run_acc[i];
  }
}

// ---- paged attention: main kernel ---------------------------------------------------------

// grid: (M, nkv·head_blocks, splits); block: kWarps warps. blockIdx.x names a token; the CTA
// works only when that token starts a query tile of its sequence (every tile_tokens-th token
// from the sequence's first), and takes the tile's tokens [x, x+Q) ∩ the sequence. Tokens of
// a sequence are consecutive positions. Row r of the CTA (r = slot·kWarps + warp) is token
// r / heads_per_cta of the tile and q head (r % heads_per_cta) of the head block.
template <typename T, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)  // <= 128 registers: 512 threads per SM
    paged_attention_kernel(const T* __restrict__ q, const T* __restrict__ gate, AttentionShape s, StepMeta meta,
                           KvCacheView cache, AttnLaunch L, T* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* kv_smem = reinterpret_cast<bf16*>(smem_raw);  // [kStages][2][kTile][hd]
  const int hd = s.head_dim, nq = s.num_q_heads;
  const int group = nq / s.num_kv_heads;
  // Tiles of the latest tokens (the longest ranges) are scheduled first.
  const int x = int(gridDim.x) - 1 - int(blockIdx.x);
  const int kvh = int(blockIdx.y) / L.head_blocks, hb = int(blockIdx.y) % L.head_blocks;
  const int z = int(blockIdx.z);
  const int seq = meta.token_seq[x];
  const int first = meta.seq_token_start[seq], end = meta.seq_token_start[seq + 1];
  if ((x - first) % L.tile_tokens != 0) return;  // CTA-uniform
  const int ntok = min(L.tile_tokens, end - x);
  const int p_hi = meta.token_pos[x + ntok - 1];
  // The CTA's KV range: chunks z, z+splits, ... of the tile's last (largest) query, whose
  // chunk size is the largest in the tile; every other row's chunks nest inside them.
  const int c_hi = chunk_size(p_hi + 1), nc_hi = p_hi / c_hi + 1;
  if (z >= nc_hi) return;  // CTA-uniform
  const bool split = L.splits > 1;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const bool has_dims = kLaneDims * lane < hd;

  // Rows of this warp.
  bool row_ok[kRowsPerWarp];
  bool row_partials[kRowsPerWarp];  // split path and several chunks: partials go to the workspace
  int row_pos[kRowsPerWarp], row_csize[kRowsPerWarp];
  size_t row_oh[kRowsPerWarp];  // token·nq + q head
  float qv[kRowsPerWarp][kLaneDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = r * kWarps + warp;
    const int t = row / L.heads_per_cta, hg = hb * L.heads_per_cta + row % L.heads_per_cta;
    row_ok[r] = t < ntok && hg < group;
    row_oh[r] = size_t(x + t) * nq + (kvh * group + hg);
    row_pos[r] = row_ok[r] ? meta.token_pos[x + t] : -1;
    row_csize[r] = chunk_size(max(row_pos[r], 0) + 1);
    row_partials[r] = split && max(row_pos[r], 0) / row_csize[r] + 1 > 1;
    const T* qrow = q + row_oh[r] * hd;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) {
      const int d = kLaneDims * lane + i;
      qv[r][i] = row_ok[r] && d < hd ? __fmul_rn(to_f32(qrow[d]), L.scale_log2) : 0.0f;
    }
  }

  // Running chunk state and the folded result of finished chunks (register path).
  float run_m[kRowsPerWarp], run_l[kRowsPerWarp], run_acc[kRowsPerWarp][kLaneDims];
  float fold_m[kRowsPerWarp], fold_l[kRowsPerWarp], fold_acc[kRowsPerWarp][kLaneDims];
  bool have[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    run_m[r] = -INFINITY;
    run_l[r] = 0.0f;
    fold_m[r] = 0.0f;
    fold_l[r] = 0.0f;
    have[r] = false;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) run_acc[r][i] = fold_acc[r][i] = 0.0f;
  }

  // The CTA's tile list: chunk k of the CTA is z + k·splits; tile i is tile (i % tpc) of
  // chunk (i / tpc); the last chunk of the range ends at p_hi.
  const int tpc = c_hi / kTile;
  const int my_chunks = (nc_hi - 1 - z) / L.splits + 1;
  const int last_chunk = z + (my_chunks - 1) * L.splits;
  const int last_tiles = last_chunk == nc_hi - 1 ? (p_hi - last_chunk * c_hi) / kTile + 1 : tpc;
  const int n_tiles = (my_chunks - 1) * tpc + last_tiles;
  auto tile_start = [&](int i) { return (z + (i / tpc) * L.splits) * c_hi + (i % tpc) * kTile; };

  const int32_t* table = meta.block_tables + size_t(seq) * meta.max_blocks_per_seq;
  const int vec_per_row = hd / kLaneDims;
  const int vec_per_tile = 2 * kTile * vec_per_row;
  const size_t stage_elems = size_t(2) * kTile * hd;
  // Copies tile i into a stage; positions past p_hi are not read (their block may not exist)
  // and their stale shared-memory contents are never used (selects below).
  auto load_tile = [&](int i, int stage) {
    const int t0 = tile_start(i);
    bf16* dst = kv_smem + size_t(stage) * stage_elems;
    for (int c = int(threadIdx.x); c < vec_per_tile; c += kWarps * 32) {
      const int which = c / (kTile * vec_per_row);  // 0: K, 1: V
      const int rem = c - which * kTile * vec_per_row;
      const int j = rem / vec_per_row, part = rem - j * vec_per_row;
      const int p = t0 + j;
      if (p > p_hi) continue;
      const size_t off =
          cache_offset(cache, table[p / cache.block_size], kvh, p % cache.block_size) + size_t(part) * kLaneDims;
      cp_async16(dst + (size_t(which) * kTile + j) * hd + part * kLaneDims, (which ? cache.v : cache.k) + off);
    }
  };

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) load_tile(st, st);
    cp_async_commit();  // empty groups keep the count uniform
  }

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile `it` have landed
    __syncthreads();               // everyone's have; and tile it-1's stage is free again
    {
      const int nx = it + kStages - 1;
      if (nx < n_tiles) load_tile(nx, nx % kStages);
      cp_async_commit();
    }
    const int t0 = tile_start(it);
    bool active[kRowsPerWarp];
    bool any = false;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      active[r] = row_ok[r] && t0 <= row_pos[r];
      any = any || active[r];
      if (active[r] && t0 % row_csize[r] == 0)  // a chunk of this row starts: empty state
        reset_running(run_m[r], run_l[r], run_acc[r]);
    }
    if (!any) continue;  // warp-uniform
    const bf16* Ks = kv_smem + size_t(it % kStages) * stage_elems;
    const bf16* Vs = Ks + size_t(kTile) * hd;

    // Scores: partial dots over the lane's 8 dims for the 16 positions, then reduce-scatter.
    float part[kRowsPerWarp][kTile];
    tile_score_partials<kRowsPerWarp>(Ks, hd, lane, has_dims, qv, part);
    float e[kRowsPerWarp];
    int nvalid[kRowsPerWarp];
    int nv_max = 0;
    float score[kRowsPerWarp];  // of position t0 + (lane & 15)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) score[r] = reduce_scatter16(part[r], lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float sc = score[r];
      e[r] = 0.0f;
      nvalid[r] = 0;
      if (active[r]) {
        const bool valid = t0 + (lane & 15) <= row_pos[r];
        nvalid[r] = min(kTile, row_pos[r] - t0 + 1);
        nv_max = max(nv_max, nvalid[r]);
        e[r] = online_softmax_step(sc, valid, run_m[r], run_l[r], run_acc[r]);
      }
    }
    // acc += e_j · V_j over the row's valid positions, in position order.
    for (int j = 0; j < nv_max; ++j) {
      float vf[kLaneDims];
      load_lane_dims(Vs, j, hd, lane, has_dims, vf);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        if (j < nvalid[r]) accumulate_ev(e[r], j, vf, run_acc[r]);  // warp-uniform; false for inactive rows
    }
    // Chunk ends: hand the partial to the workspace (split path, rows with several chunks)
    // or fold it in registers; a row's last tile also writes its output on the latter path.
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (!active[r]) continue;
      const bool row_last = t0 + kTile > row_pos[r];
      if (!row_last && (t0 + kTile) % row_csize[r] != 0) continue;
      const size_t oh = row_oh[r];
      if (row_partials[r]) {
        store_partial(L, oh * L.chunk_stride + t0 / row_csize[r], hd, lane, run_m[r], run_l[r], run_acc[r]);
      } else {
        fold_partial(fold_m[r], fold_l[r], fold_acc[r], have[r], run_m[r], run_l[r], run_acc[r]);
        if (row_last) store_output(fold_acc[r], fold_l[r], gate + oh * hd, out + oh * hd, lane, hd);
      }
    }
  }
  cp_async_wait<0>();
}

// One warp per (token, q head): folds the token's chunk partials in chunk order. Tokens with
// a single chunk were finished by the main (or decode) kernel.
template <typename T>
__global__ void __launch_bounds__(kMergeWarps * 32)
    attention_merge_kernel(const T* __restrict__ gate, AttentionShape s, StepMeta meta, AttnLaunch L,
                           T* __restrict__ out) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int m = int(blockIdx.x), h = int(blockIdx.y) * kMergeWarps + warp;
  if (h >= s.num_q_heads) return;
  const int pos = meta.token_pos[m];
  const int csize = chunk_size(pos + 1), nc = pos / csize + 1;
  if (nc == 1) return;
  pdl_wait();  // launched as a dependent of the decode kernel: its partials
  const int hd = s.head_dim;
  const size_t oh = size_t(m) * s.num_q_heads + h;
  float M = 0.0f, Lsum = 0.0f, ACC[kLaneDims] = {};
  bool have = false;
  // kMergeBatch partials are loaded together (one memory round trip, not one per chunk), then
  // folded in chunk order; the gate with the first batch. L2 loads (.cg): the partials were
  // written by a grid that may have been running when this one started.
  constexpr int kMergeBatch = 8;
  const bool has_dims = kLaneDims * lane < hd;  // hd % 8 == 0: all 8 dims or none
  float g[kLaneDims];
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i)
    g[i] = has_dims ? to_f32(__ldcg(gate + oh * hd + kLaneDims * lane + i)) : 0.0f;
  for (int c0 = 0; c0 < nc; c0 += kMergeBatch) {
    float pa[kMergeBatch][kLaneDims], pm[kMergeBatch], pl[kMergeBatch];
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b) {
      const size_t slot = oh * L.chunk_stride + min(c0 + b, nc - 1);  // clamped: loaded, not folded
      if (has_dims) {
        const float4* src = reinterpret_cast<const float4*>(L.ws_acc + slot * hd + kLaneDims * lane);
        const float4 lo = __ldcg(src), hi = __ldcg(src + 1);
        pa[b][0] = lo.x, pa[b][1] = lo.y, pa[b][2] = lo.z, pa[b][3] = lo.w;
        pa[b][4] = hi.x, pa[b][5] = hi.y, pa[b][6] = hi.z, pa[b][7] = hi.w;
      } else {
#pragma unroll
        for (int i = 0; i < kLaneDims; ++i) pa[b][i] = 0.0f;
      }
      pm[b] = __ldcg(L.ws_ml + slot * 2);
      pl[b] = __ldcg(L.ws_ml + slot * 2 + 1);
    }
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b)
      if (c0 + b < nc) fold_partial(M, Lsum, ACC, have, pm[b], pl[b], pa[b]);
  }
  if (has_dims) {
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i)
      out[oh * hd + kLaneDims * lane + i] = from_f32<T>(gated_output(ACC[i], Lsum, g[i]));
  }
}

// ---- paged attention: decode kernel -------------------------------------------------------

constexpr int kDecodeMaxTokens = 64;  // steps of at most this many tokens (one per sequence)

// Work items of the decode kernel: (token t, chunk c, y) with y = kv head · head_blocks + head
// block, numbered u·Y + y where u = first[t] + c and first[t] = Σ_{t' < t} nc(t'). Every warp
// derives the numbering itself from the tokens' positions (lane l holds tokens 2l and 2l+1),
// so the kernel needs no shared memory beyond its K/V stages.
struct DecodeTokens {
  int pos0, pos1;      // positions of tokens 2·lane, 2·lane + 1 (-1 past M)
  int seq0, seq1;      // their sequences
  int first0, first1;  // their first u
  int total;           // Σ nc over the step's tokens
};


__device__ __forceinline__ DecodeTokens decode_tokens(const StepMeta& meta, int lane) {
  DecodeTokens d;
  const int t0 = 2 * lane, t1 = 2 * lane + 1, M = meta.num_tokens;
  d.pos0 = t0 < M ? meta.token_pos[t0] : -1;
  d.pos1 = t1 < M ? meta.token_pos[t1] : -1;
  d.seq0 = t0 < M ? meta.token_seq[t0] : 0;
  d.seq1 = t1 < M ? meta.token_seq[t1] : 0;
  const int a = d.pos0 >= 0 ? num_chunks(d.pos0) : 0, b = d.pos1 >= 0 ? num_chunks(d.pos1) : 0;
  int incl = a + b;  // inclusive scan over the lanes
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += n;
  }
  d.first0 = incl - a - b;
  d.first1 = d.first0 + a;
  d.total = __shfl_sync(kFull, incl, 31);
  return d;
}

// Work item `item` = u·Y + y of the numbering above (warp-collective: every lane of the warp
// calls it with the same item): token t, chunk `chunk` of its nc chunks, positions [c0, c0 +
// chunk size) ∩ [0, pos] in n_tiles tiles, kv head kvh and head block hb (y = kvh·head_blocks +
// hb), and the token's block table.
struct DecodeItem {
  int t, pos, kvh, hb, chunk, nc, c0, n_tiles;
  const int32_t* table;
};

__device__ __forceinline__ DecodeItem map_decode_item(const DecodeTokens& tok, const StepMeta& meta, int Y,
                                                      int head_blocks, int item) {
  DecodeItem w;
  const int u = item / Y, y = item - (item / Y) * Y;
  // Token of u: the number of tokens whose first u is <= u, minus one (first[] increases).
  const unsigned b0 = __ballot_sync(kFull, tok.pos0 >= 0 && tok.first0 <= u);
  const unsigned b1 = __ballot_sync(kFull, tok.pos1 >= 0 && tok.first1 <= u);
  w.t = __popc(b0) + __popc(b1) - 1;
  const int src = w.t >> 1;
  w.pos = __shfl_sync(kFull, (w.t & 1) ? tok.pos1 : tok.pos0, src);
  const int seq = __shfl_sync(kFull, (w.t & 1) ? tok.seq1 : tok.seq0, src);
  w.chunk = u - __shfl_sync(kFull, (w.t & 1) ? tok.first1 : tok.first0, src);
  w.kvh = y / head_blocks;
  w.hb = y - w.kvh * head_blocks;
  const int csize = chunk_size(w.pos + 1);
  w.nc = (w.pos >> log2_pow2(csize)) + 1;
  w.c0 = w.chunk * csize;
  const int c_last = min(w.c0 + csize, w.pos + 1) - 1;  // the chunk's positions: [c0, c_last]
  w.n_tiles = (c_last - w.c0) / kTile + 1;
  w.table = meta.block_tables + size_t(seq) * meta.max_blocks_per_seq;
  return w;
}

// grid: (items or fewer CTAs); block: kWarps warps, kRows (token, q head) rows per warp (they
// share each K/V vector the warp reads from shared memory). Each CTA walks the items
// blockIdx.x, blockIdx.x + gridDim.x, ...; item (t, c, y) computes chunk c of token t's range
// [0, pos] for the q heads [hb·H, (hb+1)·H) (H = kRows·kWarps; row r of warp w is head
// hb·H + r·kWarps + w) of kv head kvh's group, with exactly the per-row arithmetic of
// paged_attention_kernel: the chunk's kTile-position tiles in order through the same cp.async
// pipeline, online softmax in the exp2 domain. A token with a single chunk writes its output at
// once; otherwise each item stores its chunk partial in the workspace and
// attention_merge_kernel (a programmatic dependent launch: it starts while this grid runs and
// waits for it) folds them in chunk order, as after paged_attention_kernel. This kernel is
// itself a programmatic dependent launch: it reads the step metadata (host-written) and
// starts the first item's K/V copies except the tile with the token's own position first,
// then waits for attention_prepare (which lets it launch early and writes exactly q, gate and
// that K/V row) before touching q, gate, that tile, the workspace or out. (An exception to
// pdl.cuh's rule, on purpose: the older rows were written by the attention_prepare of earlier
// steps, complete before this step began, and no kernel of the step writes them; the metadata
// comes from the step's host copy.)
template <typename T, int kWarps, int kRows>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)  // <= 128 registers
    paged_attention_decode_kernel(const T* __restrict__ q, const T* __restrict__ gate, AttentionShape s,
                                  StepMeta meta, KvCacheView cache, AttnLaunch L, T* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* kv_smem = reinterpret_cast<bf16*>(smem_raw);  // [kStages][2][kTile][hd]
  const int hd = s.head_dim, nq = s.num_q_heads;
  const int group = nq / s.num_kv_heads;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const bool has_dims = kLaneDims * lane < hd;
  const int Y = s.num_kv_heads * L.head_blocks;
  pdl_launch_dependents();  // the merge kernel may get resident now; it waits for this grid
  const DecodeTokens tok = decode_tokens(meta, lane);  // step metadata: written by a copy, not by kernels
  const int n_items = tok.total * Y;                   // CTA-uniform
  const int vec_per_row = hd / kLaneDims;
  const int vec_per_tile = 2 * kTile * vec_per_row;
  const size_t stage_elems = size_t(2) * kTile * hd;
  // Tile copies without divisions or per-position table reads when a tile lies in one cache
  // block and the 16-byte columns of a row divide the CTA's threads (head_dim 8·2^k <= 256).
  const bool fast_load = cache.block_size % kTile == 0 && (kWarps * 32) % vec_per_row == 0;
  const int load_part = int(threadIdx.x) % vec_per_row, load_row0 = int(threadIdx.x) / vec_per_row;
  const int load_row_step = (kWarps * 32) / vec_per_row;

  using Item = DecodeItem;
  auto map_item = [&](int item) { return map_decode_item(tok, meta, Y, L.head_blocks, item); };
  // Tile i of the item's chunk holds the token's own position (whose K/V attention_prepare
  // writes) iff it is the range's last tile.
  auto has_own_pos = [&](const Item& w, int i) { return w.pos < w.c0 + (i + 1) * kTile; };
  // Copies tile i of the item's chunk into a stage; positions past pos are not read (their
  // block may not exist) and their stale shared-memory contents are never used (selects below).
  auto load_tile = [&](const Item& w, int i, int stage) {
    const int t0 = w.c0 + i * kTile;
    bf16* dst = kv_smem + size_t(stage) * stage_elems;
    if (fast_load) {  // the tile lies in one cache block; thread: fixed 16-byte column `part`
      const size_t base = cache_offset(cache, w.table[t0 / cache.block_size], w.kvh, t0 % cache.block_size);
      for (int rw = load_row0; rw < 2 * kTile; rw += load_row_step) {  // rows 0..15: K, 16..31: V
        const int j = rw & (kTile - 1);
        if (t0 + j > w.pos) continue;
        cp_async16(dst + size_t(rw) * hd + load_part * kLaneDims,
                   (rw < kTile ? cache.k : cache.v) + base + size_t(j) * hd + size_t(load_part) * kLaneDims);
      }
      return;
    }
    for (int c = int(threadIdx.x); c < vec_per_tile; c += kWarps * 32) {
      const int which = c / (kTile * vec_per_row);  // 0: K, 1: V
      const int rem = c - which * kTile * vec_per_row;
      const int j = rem / vec_per_row, part = rem - j * vec_per_row;
      const int p = t0 + j;
      if (p > w.pos) continue;
      const size_t off = cache_offset(cache, w.table[p / cache.block_size], w.kvh, p % cache.block_size) +
                         size_t(part) * kLaneDims;
      cp_async16(dst + (size_t(which) * kTile + j) * hd + part * kLaneDims, (which ? cache.v : cache.k) + off);
    }
  };

  // The CTA's first item starts copying its first tiles before the wait, except a tile with
  // the token's own position: attention_prepare may still be writing that K/V row (it writes
  // nothing else this kernel reads before the wait). These copies are committed after the
  // wait, in one group with the rest of the prologue.
  if (int(blockIdx.x) < n_items) {
    const Item w = map_item(int(blockIdx.x));
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st)
      if (st < w.n_tiles && !has_own_pos(w, st)) load_tile(w, st, st);
  }
  pdl_wait();  // q, gate and the new tokens' K/V come from attention_prepare

  for (int item = int(blockIdx.x); item < n_items; item += int(gridDim.x)) {
    const bool first_item = item == int(blockIdx.x);  // CTA-uniform
    const Item w = map_item(item);
    if (first_item) {
#pragma unroll
      for (int st = 0; st < kStages - 1; ++st)
        if (st < w.n_tiles && has_own_pos(w, st)) load_tile(w, st, st);
#pragma unroll
      for (int st = 0; st < kStages - 1; ++st) cp_async_commit();  // group 0: all of them
    } else {
      __syncthreads();  // the previous item's last tile is no longer read: its stages may be refilled
#pragma unroll
      for (int st = 0; st < kStages - 1; ++st) {
        if (st < w.n_tiles) load_tile(w, st, st);
        cp_async_commit();  // empty groups keep the count uniform
      }
    }
    const int t = w.t, pos = w.pos, kvh = w.kvh, hb = w.hb, chunk = w.chunk, nc = w.nc, c0 = w.c0;
    const int n_tiles = w.n_tiles;

    bool row_ok[kRows];  // warp-uniform
    size_t row_oh[kRows];  // token·nq + q head
    float qv[kRows][kLaneDims];
    bool any_row = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int hg = hb * kRows * kWarps + r * kWarps + warp;  // q head within the group
      row_ok[r] = hg < group;
      any_row = any_row || row_ok[r];
      row_oh[r] = size_t(t) * nq + size_t(kvh) * group + size_t(row_ok[r] ? hg : 0);
      const T* qrow = q + row_oh[r] * hd;
#pragma unroll
      for (int i = 0; i < kLaneDims; ++i) {
        const int d = kLaneDims * lane + i;
        // L2 loads: attention_prepare wrote q while this grid was starting.
        qv[r][i] = row_ok[r] && d < hd ? __fmul_rn(to_f32(__ldcg(qrow + d)), L.scale_log2) : 0.0f;
      }
    }

    float run_m[kRows], run_l[kRows], run_acc[kRows][kLaneDims];
#pragma unroll
    for (int r = 0; r < kRows; ++r) reset_running(run_m[r], run_l[r], run_acc[r]);

    for (int it = 0; it < n_tiles; ++it) {
      cp_async_wait<kStages - 2>();  // this thread's copies of tile `it` have landed
      __syncthreads();               // everyone's have; and tile it-1's stage is free again
      {
        const int nx = it + kStages - 1;
        if (nx < n_tiles) load_tile(w, nx, nx % kStages);
        cp_async_commit();
      }
      if (!any_row) continue;  // warp-uniform
      const int t0 = c0 + it * kTile;
      const bf16* Ks = kv_smem + size_t(it % kStages) * stage_elems;
      const bf16* Vs = Ks + size_t(kTile) * hd;
      // Scores: partial dots over the lane's 8 dims for the 16 positions, then reduce-scatter
      // (tile_score_partials, as in paged_attention_kernel). Rows past the group compute zeros.
      float part[kRows][kTile];
      tile_score_partials<kRows>(Ks, hd, lane, has_dims, qv, part);
      const bool valid = t0 + (lane & 15) <= pos;
      const int nvalid = min(kTile, pos - t0 + 1);  // the same for every row of the token
      float e[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float sc = reduce_scatter16(part[r], lane);  // score of position t0 + (lane & 15)
        e[r] = online_softmax_step(sc, valid, run_m[r], run_l[r], run_acc[r]);
      }
      // acc += e_j · V_j over the valid positions, in position order.
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        if (j < nvalid) {  // warp-uniform
          float vf[kLaneDims];
          load_lane_dims(Vs, j, hd, lane, has_dims, vf);
#pragma unroll
          for (int r = 0; r < kRows; ++r) accumulate_ev(e[r], j, vf, run_acc[r]);
        }
      }
    }
    cp_async_wait<0>();

    if (nc == 1) {  // CTA-uniform: the chunk is the whole range (fold_partial takes it as is)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (row_ok[r])
          store_output<true>(run_acc[r], run_l[r], gate + row_oh[r] * hd, out + row_oh[r] * hd, lane, hd);
      continue;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {  // the partial, for attention_merge_kernel
      if (row_ok[r]) store_partial(L, row_oh[r] * L.chunk_stride + chunk, hd, lane, run_m[r], run_l[r], run_acc[r]);
    }
  }
}

// ---- paged attention: tile-parallel decode kernel ------------------------------------------

constexpr int kP2Heads = 4;                    // q heads per CTA (a head block)
constexpr int kP2Tiles = 4;                    // tiles per round: one per warp of a head
constexpr int kP2Warps = kP2Heads * kP2Tiles;  // warp w: head slot w / kP2Tiles, tile slot w % kP2Tiles
constexpr int kP2Pos = kP2Tiles * kTile;       // positions per round
constexpr int kP2MaxTokens = 8;                // decode steps of at most this many tokens may take it
constexpr int kP2DefaultTokens = 2;            // ... and by default (variant 1) at most this many
constexpr int kP2Ahead = 2;                    // rounds prefetched into L2 ahead of their copy
// 16-byte copy slots per thread and round at most: 2·kP2Pos rows of up to 32 vectors (head_dim 256).
constexpr int kP2MaxRowsPerThread = 2 * kP2Pos * (32 * kMaxDimsPerLane / kLaneDims) / (kP2Warps * 32);
static_assert(kChunk0 % kP2Pos == 0, "a chunk is whole rounds");

// Arrival counts of the tile-parallel kernel's in-kernel fold, one per (token, kv head, head
// block) of a launch: zero at module load, and the last arrival sets its count back to zero, so
// they are zero between launches. Per device; launches of the kernel on one device must not
// overlap (they run in stream order on the model's stream).
constexpr int kFoldSlots = kP2MaxTokens * 256;
__device__ unsigned g_fold_count[kFoldSlots];

// Dynamic shared memory of the tile-parallel kernel: one round of K and V, [K|V][kP2Pos][hd] bf16.
size_t decode2_smem_bytes(int hd) { return size_t(2) * kP2Pos * size_t(hd) * sizeof(bf16); }

// Folds the nc chunk partials of slots base .. base + nc - 1 in chunk order for dims 2·pair and
// 2·pair + 1 (fold_partial's operations; the first partial taken as is): the result in A0, A1
// (unnormalised) and Lsum. L2 loads: other CTAs wrote the partials.
__device__ __forceinline__ void fold_pairs(const AttnLaunch& L, size_t base, int nc, int hd, int pair, float& A0,
                                           float& A1, float& Lsum) {
  constexpr int kBatch = 12;  // partials loaded together (one round trip up to 12 chunks), then folded
  float M = 0.0f;
  bool have = false;
  for (int c = 0; c < nc; c += kBatch) {
    float pm[kBatch], pl[kBatch];
    float2 pa[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const size_t slot = base + min(c + b, nc - 1);  // clamped: loaded, not folded
      pa[b] = __ldcg(reinterpret_cast<const float2*>(L.ws_acc + slot * hd + 2 * pair));
      pm[b] = __ldcg(L.ws_ml + slot * 2);
      pl[b] = __ldcg(L.ws_ml + slot * 2 + 1);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (c + b >= nc) break;
      if (!have) {
        M = pm[b], Lsum = pl[b], A0 = pa[b].x, A1 = pa[b].y;
        have = true;
        continue;
      }
      const float nm = fmaxf(M, pm[b]);
      const float ea = exp2_approx(__fsub_rn(M, nm)), eb = exp2_approx(__fsub_rn(pm[b], nm));
      Lsum = __fmaf_rn(Lsum, ea, __fmul_rn(pl[b], eb));
      A0 = __fmaf_rn(A0, ea, __fmul_rn(pa[b].x, eb));
      A1 = __fmaf_rn(A1, ea, __fmul_rn(pa[b].y, eb));
      M = nm;
    }
  }
}

// grid: (items or fewer CTAs); block: kP2Warps warps. The work items are those of
// paged_attention_decode_kernel with head blocks of kP2Heads q heads: (token t, chunk c, kv head,
// head block), numbered as there, walked blockIdx.x, blockIdx.x + gridDim.x, ... A chunk is
// done in rounds of kP2Tiles tiles (one round for the kChunk0-position chunks of contexts up to
// kMaxChunks·kChunk0). Per round:
//   1. all the round's K and V rows (positions <= pos) are copied at once (cp.async, one group)
//      into [K|V][kP2Pos][hd]: with one buffer (L.stages 1) now, with two during the round
//      before, whose step 1 also sends the next round's copy (this item's or its next one's);
//      the rows of the CTA's round kP2Ahead ahead are prefetched into L2;
//   2. warp (head slot hs, tile slot ts) computes the 16 scores of tile ts for its head with
//      the tile kernel's operations (tile_score_partials, reduce_scatter16) and the tile's
//      masked maximum (half_warp_max), published in shared memory;
//   3. each warp forms the running maximum before and after its tile (a prefix of the round's
//      tile maxima: fmaxf is exact, so this is the serial chain's value), its weights e =
//      2^(s - max) and their half-warp sum, published in shared memory;
//   4. warp (hs, ts) runs the serial part of the online softmax for head hs over the round's
//      tiles in order: (max, sum) with the same fmaxf / exp2 / fma as online_softmax_step, and
//      acc = acc · corr, then acc += e_j · V_j (one __fmaf_rn per position, in position order)
//      for dims 2·(32·ts + lane) and the next: the dims of a head are split over its four warps,
//      which changes where each dim's chain runs, not its operations.
// So a row's arithmetic is exactly that of paged_attention_kernel / paged_attention_decode_kernel
// (bit-identical), but the scores, maxima and weights of a round's tiles are computed side by
// side and only the per-dim multiply-add chain is serial: the critical path of a chunk is one
// copy round trip, one score tile and 16 multiply-adds per position, instead of one pipelined
// score + accumulate step per tile. Single-chunk tokens write out = acc / sum · sigmoid(gate);
// the others store their partial, and the last CTA of the token's (kv head, head block) folds
// them (L.fold_in_kernel; else attention_merge_kernel does). PDL as paged_attention_decode_kernel:
// the step metadata and every K/V row but the token's own are read before the wait, nothing
// else; the arrival counts are touched after it (launches of the kernel never overlap).
template <typename T>
__global__ void __launch_bounds__(kP2Warps * 32, 1)
    paged_attention_decode2_kernel(const T* __restrict__ q, const T* __restrict__ gate, AttentionShape s,
                                   StepMeta meta, KvCacheView cache, AttnLaunch L, T* __restrict__ out,
                                   PrepIn<T> prep) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Measurement builds only (stage_stamps.cuh): 0 entry, 1 the wait, 2 q (and own K / V) prepared,
  // 3 the first round's K / V in shared memory, 4 the rounds done, 5 the partial stored and fenced,
  // 6 the arrival counted, 7 the output written (the folding CTA), 8 exit; a CTA that walks several
  // items reports its last one's.
  StageStamps<9> stamps;
  stamps.mark(0);
  int st_chunk = -1, st_nc = -1, st_last = -1;
  __shared__ float s_tmax[kP2Heads][kP2Tiles];  // masked maximum of each tile's scores
  __shared__ float s_sum[kP2Heads][kP2Tiles];   // half-warp sum of each tile's weights
  __shared__ __align__(16) float s_e[kP2Heads][kP2Pos];  // weight of each position of the round
  __shared__ bool s_last;                                  // this CTA folds the token's partials
  // With prep: the item's q heads after attention_prepare's norm and RoPE (also its rotation scratch),
  // then the token's own K (normed, rotated) and V rows, f32.
  __shared__ __align__(16) float s_prep[kP2Heads + 2][32 * kMaxDimsPerLane];
  const bool fused = prep.qg != nullptr;  // launch-uniform
  const int hd = s.head_dim, nq = s.num_q_heads;
  const int group = nq / s.num_kv_heads;
  // L.stages buffers of one round each: [K|V][kP2Pos][hd] bf16; round g of the CTA uses buffer g % stages.
  bf16* const k_base = reinterpret_cast<bf16*>(smem_raw);
  const size_t buf_elems = size_t(2) * kP2Pos * hd;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int hs = warp / kP2Tiles, ts = warp % kP2Tiles;
  const bool has_dims = kLaneDims * lane < hd;
  const int pair = 32 * ts + lane;  // step 4: dims 2·pair and 2·pair + 1
  const bool has_pair = 2 * pair < hd;
  const int Y = s.num_kv_heads * L.head_blocks;
  const int bs_shift = log2_pow2(cache.block_size), bs_mask = cache.block_size - 1;  // a power of two
  pdl_launch_dependents();  // the next kernel may get resident now; it waits for this grid
  const DecodeTokens tok = decode_tokens(meta, lane);  // step metadata: written by a copy, not by kernels
  const int n_items = tok.total * Y;                   // CTA-uniform
  const int vec_per_row = hd / kLaneDims;
  constexpr int kThreads = kP2Warps * 32;
  // Copy slots: every thread owns one 16-byte column of rows row0 + i·step (K rows 0..kP2Pos-1,
  // then V rows), at most kP2MaxRowsPerThread of them (head_dim 8·2^k: the launcher checks).
  const int copy_part = tid % vec_per_row, copy_row0 = tid / vec_per_row, copy_step = kThreads / vec_per_row;

  // Copies the rows of the round starting at position p0 of item w that are <= w.pos into
  // shared memory: mode 0 those before the token's own position, 1 only that one, 2 all. The
  // block-table entries first (independent loads), then the copies.
  auto load_round = [&](const DecodeItem& w, int p0, int mode, bf16* k_s) {
    auto wanted = [&](int p) { return p <= w.pos && (mode == 2 || ((mode == 1) == (p == w.pos))); };
    int blk[kP2MaxRowsPerThread];
#pragma unroll
    for (int i = 0; i < kP2MaxRowsPerThread; ++i) {
      const int rw = copy_row0 + i * copy_step, p = p0 + (rw & (kP2Pos - 1));
      blk[i] = rw < 2 * kP2Pos && wanted(p) ? w.table[p >> bs_shift] : -1;
    }
#pragma unroll
    for (int i = 0; i < kP2MaxRowsPerThread; ++i) {
      const int rw = copy_row0 + i * copy_step, p = p0 + (rw & (kP2Pos - 1));
      if (blk[i] < 0) continue;
      const size_t off = cache_offset(cache, blk[i], w.kvh, p & bs_mask) + size_t(copy_part) * kLaneDims;
      cp_async16(k_s + size_t(rw) * hd + copy_part * kLaneDims, (rw < kP2Pos ? cache.k : cache.v) + off);
    }
  };
  // L2 prefetch of the round starting at p0 of item w: one 128-byte line per thread.
  const int lines_per_row = (hd * int(sizeof(bf16)) + 127) / 128;
  auto prefetch_round = [&](const DecodeItem& w, int p0) {
    const int rw = tid / lines_per_row, line = tid - rw * lines_per_row;
    const int p = p0 + (rw & (kP2Pos - 1));
    if (rw >= 2 * kP2Pos || p > w.pos) return;
    const size_t off = cache_offset(cache, w.table[p >> bs_shift], w.kvh, p & bs_mask) +
                       size_t(line) * (128 / sizeof(bf16));
    prefetch_l2((rw < kP2Pos ? cache.k : cache.v) + off);
  };

  // The CTA's first item starts copying its first round before the wait, except the token's
  // own row (attention_prepare may still be writing it); committed after the wait.
  if (int(blockIdx.x) < n_items) {
    const DecodeItem w = map_decode_item(tok, meta, Y, L.head_blocks, int(blockIdx.x));
    load_round(w, w.c0, 0, k_base);
  }
  pdl_wait();  // q, gate and the new tokens' K/V come from attention_prepare
  stamps.mark(1);

  // The round `ahead` rounds after (item, r) in the CTA's walk: round nr of item nitem (nw), this
  // item's or one of its next ones' (CTA-uniform); false past the CTA's last.
  auto round_ahead = [&](int item, const DecodeItem& w, int r, int ahead, int& nitem, DecodeItem& nw, int& nr) {
    nitem = item, nw = w, nr = r + ahead;
    while (nr >= (nw.n_tiles - 1) / kP2Tiles + 1) {
      nr -= (nw.n_tiles - 1) / kP2Tiles + 1;
      nitem += int(gridDim.x);
      if (nitem >= n_items) return false;
      nw = map_decode_item(tok, meta, Y, L.head_blocks, nitem);
    }
    return true;
  };
  int g = 0;  // the CTA's round count: buffer g % L.stages

  for (int item = int(blockIdx.x); item < n_items; item += int(gridDim.x)) {
    const bool first_item = item == int(blockIdx.x);  // CTA-uniform
    const DecodeItem w = map_decode_item(tok, meta, Y, L.head_blocks, item);
    const int hg = w.hb * kP2Heads + hs;  // q head within the group
    const bool row_ok = hg < group;       // warp-uniform
    const size_t oh = size_t(w.t) * nq + size_t(w.kvh) * group + size_t(row_ok ? hg : 0);
    if (fused) {
      // attention_prepare's work for this item, with its device function and lane layout (the same
      // bits): warp (hs, 0) its q head into s_prep[hs]; in the token's last chunk warp (0, 1) the own K
      // and V rows into s_prep[kP2Heads ..], which the head block 0 CTA also writes to the cache.
      const bool own = w.chunk == w.nc - 1;  // CTA-uniform
      if ((ts == 0 && row_ok) || (own && hs == 0 && ts == 1)) {  // warp-uniform
        const bool is_k = ts == 1;
        float vals[kMaxDimsPerLane];
        const T* src = is_k ? prep.k + (size_t(w.t) * s.num_kv_heads + w.kvh) * hd : prep.qg + oh * 2 * hd;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerLane; ++i) {
          const int d = lane + 32 * i;
          vals[i] = d < hd ? to_f32(__ldcg(src + d)) : 0.0f;
        }
        float* row = s_prep[is_k ? kP2Heads : hs];
        norm_rope(vals, hd, is_k ? prep.k_norm_w : prep.q_norm_w, s.rms_eps, prep.inv_freq, s.rotary_dim, w.pos, row);
        const T* vsrc = prep.v + (size_t(w.t) * s.num_kv_heads + w.kvh) * hd;
        size_t off = 0;
        if (is_k) off = cache_offset(cache, w.table[w.pos >> bs_shift], w.kvh, w.pos & bs_mask);
#pragma unroll
        for (int i = 0; i < kMaxDimsPerLane; ++i) {
          const int d = lane + 32 * i;
          if (d >= hd) continue;
          if (!is_k) {
            row[d] = to_f32(from_f32<T>(vals[i]));  // q as attention_prepare stores it
            continue;
          }
          const float vv = to_f32(__ldcg(vsrc + d));
          row[d] = vals[i];
          s_prep[kP2Heads + 1][d] = vv;
          if (w.hb == 0) {
            cache.k[off + d] = __float2bfloat16(vals[i]);
            cache.v[off + d] = __float2bfloat16(vv);
          }
        }
      }
      __syncthreads();  // the item's q heads and own rows
      stamps.mark(2);
    }
    float qv[1][kLaneDims];
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) {
      const int d = kLaneDims * lane + i;
      // L2 loads: attention_prepare wrote q while this grid was starting (with prep: this CTA did).
      qv[0][i] = row_ok && d < hd
                     ? __fmul_rn(fused ? s_prep[hs][d] : to_f32(__ldcg(q + oh * hd + d)), L.scale_log2)
                     : 0.0f;
    }
    float g0 = 0.0f, g1 = 0.0f;  // the gate of the warp's two dims (for the output, if this CTA writes it)
    if ((w.nc == 1 || L.fold_in_kernel) && row_ok && has_pair) {
      const T* gsrc = fused ? prep.qg + oh * 2 * hd + hd : gate + oh * hd;  // with prep: q_proj's gate half
      g0 = to_f32(__ldcg(gsrc + 2 * pair));
      g1 = to_f32(__ldcg(gsrc + 2 * pair + 1));
    }
    float run_m = -INFINITY, run_l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
    const int n_rounds = (w.n_tiles - 1) / kP2Tiles + 1;
    for (int r = 0; r < n_rounds; ++r, ++g) {
      const int p0 = w.c0 + r * kP2Pos;
      bf16* const k_s = k_base + size_t(g % L.stages) * buf_elems;
      const bf16* const v_s = k_s + size_t(kP2Pos) * hd;
      // One buffer: this round's copy now. Two: this round was requested during the previous one
      // (except the CTA's first), and the next round's copy goes out before this one is used.
      // With prep the token's own row is never copied (it is not in the cache yet): this CTA forms it.
      if (L.stages == 1 || g == 0) {
        if (!(fused && first_item && r == 0)) load_round(w, p0, fused ? 0 : first_item && r == 0 ? 1 : 2, k_s);
        cp_async_commit();
      }
      bool next_in_flight = false;
      if (L.stages == 2) {
        int nitem, nr;
        DecodeItem nw;
        if (round_ahead(item, w, r, 1, nitem, nw, nr)) {
          load_round(nw, nw.c0 + nr * kP2Pos, fused ? 0 : 2, k_base + size_t((g + 1) % 2) * buf_elems);
          cp_async_commit();
          next_in_flight = true;
        }
      }
      // The CTA's rounds kP2Ahead ahead (of this item or its next ones) on their way to L2; the
      // first round also sends the ones before.
      for (int ahead = first_item && r == 0 ? 1 : kP2Ahead; ahead <= kP2Ahead; ++ahead) {
        int it, rr;
        DecodeItem x;
        if (round_ahead(item, w, r, ahead, it, x, rr)) prefetch_round(x, x.c0 + rr * kP2Pos);
      }
      if (next_in_flight)
        cp_async_wait<1>();
      else
        cp_async_wait<0>();
      if (fused && w.pos >= p0 && w.pos < p0 + kP2Pos) {  // CTA-uniform: the round holds the token's own row
        const size_t row = size_t(w.pos - p0) * hd;
        for (int d = tid; d < hd; d += kThreads) {
          k_s[row + d] = __float2bfloat16(s_prep[kP2Heads][d]);
          k_s[size_t(kP2Pos) * hd + row + d] = __float2bfloat16(s_prep[kP2Heads + 1][d]);
        }
      }
      __syncthreads();  // the round's K and V are in shared memory
      if (r == 0) stamps.mark(3);

      // 2. Scores of tile ts for head hs.
      const int ti = r * kP2Tiles + ts;  // tile of the chunk
      const bool tile_ok = row_ok && ti < w.n_tiles;  // warp-uniform
      const int t0 = w.c0 + ti * kTile;
      const bool valid = t0 + (lane & 15) <= w.pos;
      float sc = 0.0f;
      if (tile_ok) {
        float part[1][kTile];
        tile_score_partials<1>(k_s + size_t(ts) * kTile * hd, hd, lane, has_dims, qv, part);
        sc = reduce_scatter16(part[0], lane);  // score of position t0 + (lane & 15)
        const float tmax = half_warp_max(valid ? sc : -INFINITY);
        if (lane == 0) s_tmax[hs][ts] = tmax;
      }
      __syncthreads();

      // 3. The running maximum after tile ts (the serial chain's value), the tile's weights.
      if (tile_ok) {
        float nm = run_m;
#pragma unroll
        for (int k = 0; k < kP2Tiles; ++k)
          if (k <= ts) nm = fmaxf(nm, s_tmax[hs][k]);
        const float e = valid ? exp2_approx(__fsub_rn(sc, nm)) : 0.0f;
        const float sum = half_warp_sum(e);
        if (lane < kTile) s_e[hs][ts * kTile + lane] = e;
        if (lane == 0) s_sum[hs][ts] = sum;
      }
      __syncthreads();

      // 4. The serial part, tile by tile: online_softmax_step's (max, sum, acc) updates, then
      // accumulate_ev's multiply-adds in position order, for the warp's two dims.
      if (row_ok) {
        const int nt = min(kP2Tiles, w.n_tiles - r * kP2Tiles);
        for (int k = 0; k < nt; ++k) {
          const float nm = fmaxf(run_m, s_tmax[hs][k]);  // finite: the tile's first position is visible
          const float corr = exp2_approx(__fsub_rn(run_m, nm));
          run_l = __fmaf_rn(run_l, corr, s_sum[hs][k]);
          run_m = nm;
          acc0 = __fmul_rn(acc0, corr);
          acc1 = __fmul_rn(acc1, corr);
          const int nvalid = min(kTile, w.pos - (p0 + k * kTile) + 1);
          if (has_pair) {
            // All 16 weights and V pairs first (rows past nvalid hold stale values and are
            // not used), then the chain.
            float e[kTile];
            unsigned vv[kTile];
            const float4* e4 = reinterpret_cast<const float4*>(s_e[hs] + k * kTile);
#pragma unroll
            for (int j = 0; j < kTile / 4; ++j) {
              const float4 x = e4[j];
              e[4 * j] = x.x, e[4 * j + 1] = x.y, e[4 * j + 2] = x.z, e[4 * j + 3] = x.w;
            }
            const bf16* vrow = v_s + size_t(k) * kTile * hd + 2 * pair;
#pragma unroll
            for (int j = 0; j < kTile; ++j) vv[j] = *reinterpret_cast<const unsigned*>(vrow + size_t(j) * hd);
#pragma unroll
            for (int j = 0; j < kTile; ++j) {
              if (j < nvalid) {  // warp-uniform
                acc0 = __fmaf_rn(e[j], __uint_as_float(vv[j] << 16), acc0);
                acc1 = __fmaf_rn(e[j], __uint_as_float(vv[j] & 0xffff0000u), acc1);
              }
            }
          }
        }
      }
      __syncthreads();  // the buffers may be refilled
    }
    stamps.mark(4);
    st_chunk = w.chunk, st_nc = w.nc;

    // The chunk is the whole range (w.nc == 1: fold_partial would take it as is), or the partials
    // of all chunks are folded here by the last CTA, or by attention_merge_kernel.
    float A0 = acc0, A1 = acc1, Lsum = run_l;
    if (w.nc > 1) {  // CTA-uniform
      const size_t base = oh * L.chunk_stride;  // the token's chunk slots for this q head
      if (row_ok) {                             // the chunk's partial
        if (ts == 0 && lane == 0) {
          L.ws_ml[(base + w.chunk) * 2] = run_m;
          L.ws_ml[(base + w.chunk) * 2 + 1] = run_l;
        }
        if (has_pair)
          *reinterpret_cast<float2*>(L.ws_acc + (base + w.chunk) * hd + 2 * pair) = make_float2(acc0, acc1);
      }
      if (!L.fold_in_kernel) continue;  // launch-uniform: attention_merge_kernel folds them
      // The last of the nc CTAs of (token, kv head, head block) to get here folds the partials
      // in chunk order, as attention_merge_kernel would (fold_partial's operations per dim).
      __threadfence();  // this thread's partial is visible device-wide before the count below
      __syncthreads();
      stamps.mark(5);
      if (tid == 0) {
        unsigned* count = g_fold_count + size_t(w.t) * Y + size_t(w.kvh) * L.head_blocks + w.hb;
        const bool last = atomicAdd(count, 1u) == unsigned(w.nc - 1);
        if (last) {
          atomicExch(count, 0u);  // zero again for the next launch
          __threadfence();        // the others' partials are visible to this CTA's reads below
        }
        s_last = last;
      }
      __syncthreads();
      stamps.mark(6);
      st_last = s_last;
      if (!s_last || !row_ok || !has_pair) continue;  // no barrier until the next item's first one
      fold_pairs(L, base, w.nc, hd, pair, A0, A1, Lsum);
    }
    if (row_ok && has_pair) {
      T* const o = out + oh * hd + 2 * pair;
      o[0] = from_f32<T>(gated_output(A0, Lsum, g0));
      o[1] = from_f32<T>(gated_output(A1, Lsum, g1));
      stamps.mark(7);
    }
  }
  stamps.mark(8);
  stamps.print("attention_decode2", 1, st_chunk, st_nc, st_last);
}

// ---- launchers ----------------------------------------------------------------------------

int sm_count() { return current_device_sm_count(); }

// Chunk slots per (token, q head) for positions below max_positions.
size_t chunk_slots(long long max_positions) {
  const long long c = (std::max(max_positions, 1LL) - 1) / kChunk0 + 1;
  return size_t(std::min<long long>(kMaxChunks, c));
}

// Workspace per token: the chunk partials (acc and (max, sum) per q head and chunk slot).
size_t split_bytes_per_token(const AttentionShape& s, size_t slots) {
  return size_t(s.num_q_heads) * slots * (size_t(s.head_dim) + 2) * sizeof(float);
}

void check_shape(const AttentionShape& s) {
  if (s.head_dim <= 0 || s.head_dim > 32 * kMaxDimsPerLane)
    throw Error("attention: head_dim must be in [1, 256], got " + std::to_string(s.head_dim));
  if (s.num_kv_heads <= 0 || s.num_q_heads <= 0 || s.num_q_heads % s.num_kv_heads != 0)
    throw Error("attention: " + std::to_string(s.num_q_heads) + " query heads are not a multiple of " +
                std::to_string(s.num_kv_heads) + " KV heads");
}

template <typename T>
void launch_prepare(const T* qg, const T* k, const T* v, const float* q_norm_w, const float* k_norm_w,
                    const float* inv_freq, const AttentionShape& shape, const StepMeta& meta, KvCacheView cache,
                    T* q_out, T* gate_out, cudaStream_t stream) {
  if (meta.num_tokens == 0) return;
  check_shape(shape);
  const long long items = (long long)meta.num_tokens * (shape.num_q_heads + shape.num_kv_heads);
  const unsigned blocks = unsigned((items + kPrepWarps - 1) / kPrepWarps);
  // A programmatic dependent launch for decode-sized steps (about one wave at most).
  launch_pdl(meta.num_tokens <= kPrepPdlMaxTokens, attention_prepare_kernel<T>, dim3(blocks), dim3(kPrepWarps * 32), 0,
             stream, qg, k, v, q_norm_w, k_norm_w, inv_freq, shape, meta, cache, q_out, gate_out);
}

template <typename T, int kWarps>
void launch_main(dim3 grid, size_t smem, const T* q, const T* gate, const AttentionShape& shape,
                 const StepMeta& meta, KvCacheView cache, const AttnLaunch& L, T* out, cudaStream_t stream) {
  paged_attention_kernel<T, kWarps><<<grid, kWarps * 32, smem, stream>>>(q, gate, shape, meta, cache, L, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <typename T, int kWarps, int kRows>
void launch_decode(size_t smem, size_t items, const T* q, const T* gate, const AttentionShape& shape,
                   const StepMeta& meta, KvCacheView cache, const AttnLaunch& L, T* out, cudaStream_t stream) {
  // Resident CTAs: __launch_bounds__ caps registers at 128 (16 / kWarps CTAs per SM) and a CTA
  // takes at most 48 KB of shared memory (4 per SM). More CTAs would only wait for a slot.
  const size_t cap = size_t(sm_count()) * size_t(16 / kWarps);
  const unsigned grid = unsigned(std::max<size_t>(1, std::min(items, cap)));
  launch_pdl(true, paged_attention_decode_kernel<T, kWarps, kRows>, dim3(grid), dim3(kWarps * 32), smem, stream, q,
             gate, shape, meta, cache, L, out);  // one wave at most
}

// The decode variant (set_attention_decode_variant).
std::atomic<int> g_decode_variant{1};

int decode_variant() { return g_decode_variant.load(std::memory_order_relaxed); }

// One-time set-up of the tile-parallel decode kernel (for the device of first use, as
// sm_count()): the opt-in to its shared memory (above 48 KB at head_dim > 192), and its resident
// CTAs per SM. paged_attention_workspace_bytes does it, since callers size the workspace before
// any step (and so outside CUDA-graph capture); otherwise the first launch does.
template <typename T>
int decode2_setup_one(int smem) {
  MOESERVE_CUDA_CHECK(
      cudaFuncSetAttribute(paged_attention_decode2_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int n = 0;
  MOESERVE_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, paged_attention_decode2_kernel<T>, kP2Warps * 32, smem));
  return n;
}

// Rounds of K/V the kernel can hold in shared memory on this device: 2 where two rounds at the
// largest head dim fit beside its static shared memory (the H200: 2 x 64 KB at head_dim 256), else
// 1 (the DGX Spark's 99 KB per block).
int decode2_max_stages() {
  static const int n = [] {
    int dev = 0, optin = 0;
    MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes fa{};
    MOESERVE_CUDA_CHECK(cudaFuncGetAttributes(&fa, paged_attention_decode2_kernel<float>));
    return size_t(optin) >= 2 * decode2_smem_bytes(32 * kMaxDimsPerLane) + fa.sharedSizeBytes ? 2 : 1;
  }();
  return n;
}

int decode2_ctas_per_sm() {
  static const int n = [] {  // a throw leaves it unset: the next call tries again
    const int smem = int(size_t(decode2_max_stages()) * decode2_smem_bytes(32 * kMaxDimsPerLane));
    return std::max(1, std::min(decode2_setup_one<float>(smem), decode2_setup_one<bf16>(smem)));
  }();
  return n;
}

std::atomic<int> g_decode2_stages{2};  // set_attention_decode_stages: the most rounds in shared memory

// The tile-parallel decode kernel: a grid of at most the resident CTAs.
template <typename T>
void launch_decode2(size_t items, const T* q, const T* gate, const AttentionShape& shape, const StepMeta& meta,
                    KvCacheView cache, const AttnLaunch& L, T* out, cudaStream_t stream, const PrepIn<T>& prep = {}) {
  const size_t cap = size_t(sm_count()) * size_t(decode2_ctas_per_sm());
  const unsigned grid = unsigned(std::max<size_t>(1, std::min(items, cap)));
  AttnLaunch l = L;
  l.stages = std::min(decode2_max_stages(), g_decode2_stages.load(std::memory_order_relaxed));
  launch_pdl(true, paged_attention_decode2_kernel<T>, dim3(grid), dim3(kP2Warps * 32),
             size_t(l.stages) * decode2_smem_bytes(shape.head_dim), stream, q, gate, shape, meta, cache, l, out, prep);
}

// A decode step's launch parameters shared by its kernels: one token per CTA tile, no grid split, the
// chunk partials (several chunk slots) in the workspace.
AttnLaunch decode_launch(const AttentionShape& shape, int M, size_t slots, float scale, void* workspace) {
  AttnLaunch L{};
  L.tile_tokens = 1;
  L.splits = 1;
  L.chunk_stride = int(slots);
  L.scale_log2 = scale * kLog2e;
  if (slots > 1) {
    L.ws_acc = static_cast<float*>(workspace);
    L.ws_ml = L.ws_acc + size_t(M) * shape.num_q_heads * slots * shape.head_dim;
  }
  return L;
}

// The tile-parallel decode kernel's launch for a decode step (launch_attention's choice): false where the
// step is not one (more tokens than the variant takes, head dims other than 8·2^k, cache blocks other
// than 2^k positions, too small a workspace), leaving L as it was. items: its work items; L.fold_in_kernel
// false with several chunk slots: the merge kernel must follow.
bool decode2_plan(const AttentionShape& shape, const StepMeta& meta, const KvCacheView& cache, float scale,
                  void* workspace, size_t workspace_bytes, AttnLaunch& L, size_t& items) {
  const int M = meta.num_tokens;
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const size_t slots = chunk_slots((long long)meta.max_blocks_per_seq * cache.block_size);
  const size_t per_token = split_bytes_per_token(shape, slots);
  if (M != meta.num_seqs || M > kDecodeMaxTokens) return false;
  if (!(slots == 1 || (workspace != nullptr && size_t(M) * per_token <= workspace_bytes))) return false;
  const int variant = decode_variant();
  // The tile-parallel kernel takes cache blocks of 2^k positions and head dims of 8·2^k.
  const bool pow2 = (cache.block_size & (cache.block_size - 1)) == 0 &&
                    ((shape.head_dim / kLaneDims) & (shape.head_dim / kLaneDims - 1)) == 0;
  // Variant 1 (default): steps of <= kP2DefaultTokens; 2: <= kP2MaxTokens (run S6 in docs/PERF.md:
  // 12.7 vs 23.7 us at one token, context 512, but 55.0 vs 31.4 us at eight).
  if (!pow2 || !((variant == 1 && M <= kP2DefaultTokens) || (variant == 2 && M <= kP2MaxTokens))) return false;
  L = decode_launch(shape, M, slots, scale, workspace);
  // Small steps: the tile-parallel kernel, head blocks of kP2Heads q heads (more CTAs).
  L.heads_per_cta = kP2Heads;
  L.head_blocks = (group + kP2Heads - 1) / kP2Heads;
  const size_t Y = size_t(shape.num_kv_heads) * L.head_blocks;
  L.fold_in_kernel = slots > 1 && size_t(M) * Y <= size_t(kFoldSlots);
  items = size_t(M) * Y * slots;
  return true;
}

template <typename T>
void launch_attention(const T* q, const T* gate, const AttentionShape& shape, const StepMeta& meta,
                      KvCacheView cache, float scale, void* workspace, size_t workspace_bytes, T* out,
                      cudaStream_t stream) {
  const int M = meta.num_tokens;
  if (M == 0) return;
  check_shape(shape);
  if (shape.head_dim % kLaneDims != 0)
    throw Error("attention: head_dim must be a multiple of 8, got " + std::to_string(shape.head_dim));
  if (cache.head_dim != shape.head_dim || cache.num_kv_heads != shape.num_kv_heads)
    throw Error("attention: the KV cache geometry does not match the attention shape");
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const size_t slots = chunk_slots((long long)meta.max_blocks_per_seq * cache.block_size);
  const size_t per_token = split_bytes_per_token(shape, slots);
  const size_t smem = size_t(kStages) * 2 * kTile * shape.head_dim * sizeof(bf16);
  const bool decode = M == meta.num_seqs;
  // Decode steps of up to kDecodeMaxTokens tokens: one CTA per (token, chunk, kv head, head
  // block) work item, then the merge kernel (same bits as the tile kernel below).
  if (decode && M <= kDecodeMaxTokens &&
      (slots == 1 || (workspace != nullptr && size_t(M) * per_token <= workspace_bytes))) {
    AttnLaunch L = decode_launch(shape, M, slots, scale, workspace);
    // Heads per CTA: 4 (one per warp) for small groups, 8 (two head blocks of the 122B's group
    // of 16, so that a lone decode spreads over twice the SMs) or 16. With 8: steps of <= 4
    // tokens run 8 warps of one row (more warps per SM to hide latency: few items), larger
    // steps 4 warps of two rows (they share every K/V vector read from shared memory: fewer
    // instructions per score). Same bits either way.
    L.heads_per_cta = group <= 4 ? 4 : group <= 16 ? 8 : 16;
    L.head_blocks = (group + L.heads_per_cta - 1) / L.heads_per_cta;
    size_t items2 = 0;
    if (decode2_plan(shape, meta, cache, scale, workspace, workspace_bytes, L, items2)) {  // L untouched if not
      launch_decode2<T>(items2, q, gate, shape, meta, cache, L, out, stream);
      if (L.fold_in_kernel) return;  // no merge kernel
    } else {
      const size_t items = size_t(M) * shape.num_kv_heads * L.head_blocks * slots;
      switch (L.heads_per_cta) {
        case 4: launch_decode<T, 4, 1>(smem, items, q, gate, shape, meta, cache, L, out, stream); break;
        case 8:
          if (M <= 4)
            launch_decode<T, 8, 1>(smem, items, q, gate, shape, meta, cache, L, out, stream);
          else
            launch_decode<T, 4, 2>(smem, items, q, gate, shape, meta, cache, L, out, stream);
          break;
        default: launch_decode<T, 8, 2>(smem, items, q, gate, shape, meta, cache, L, out, stream); break;
      }
    }
    if (slots > 1) {  // tokens with several chunks: fold the partials (waits for the decode grid)
      const dim3 mgrid(unsigned(M), unsigned((shape.num_q_heads + kMergeWarps - 1) / kMergeWarps));
      launch_pdl(true, attention_merge_kernel<T>, mgrid, dim3(kMergeWarps * 32), 0, stream, gate, shape, meta, L,
                 out);
    }
    return;
  }
  // Decode steps (one token per sequence) take the smallest CTA that holds the group's rows;
  // steps with prefill chunks or verify batches take 16 warps so that several tokens of a
  // sequence share each K/V tile.
  const int warps = !decode ? 16 : group <= 2 * 4 ? 4 : group <= 2 * 8 ? 8 : 16;
  const int rows = kRowsPerWarp * warps;
  AttnLaunch L{};
  L.heads_per_cta = std::min(group, rows);
  L.head_blocks = (group + L.heads_per_cta - 1) / L.heads_per_cta;
  L.tile_tokens = rows / L.heads_per_cta;
  L.scale_log2 = scale * kLog2e;
  // Split the KV range over CTAs when the step is small and the workspace holds the partials.
  L.chunk_stride = int(slots);
  L.splits = 1;
  if (slots > 1 && workspace != nullptr && size_t(M) * per_token <= workspace_bytes) {
    const long long ctas = (long long)M * shape.num_kv_heads * L.head_blocks;
    const long long want = (2LL * sm_count() + ctas - 1) / ctas;
    L.splits = int(std::max<long long>(1, std::min<long long>(want, (long long)slots)));
  }
  if (L.splits > 1) {
    L.ws_acc = static_cast<float*>(workspace);
    L.ws_ml = L.ws_acc + size_t(M) * shape.num_q_heads * slots * shape.head_dim;
  }
  const dim3 grid(unsigned(M), unsigned(shape.num_kv_heads * L.head_blocks), unsigned(L.splits));
  switch (warps) {
    case 4: launch_main<T, 4>(grid, smem, q, gate, shape, meta, cache, L, out, stream); break;
    case 8: launch_main<T, 8>(grid, smem, q, gate, shape, meta, cache, L, out, stream); break;
    default: launch_main<T, 16>(grid, smem, q, gate, shape, meta, cache, L, out, stream); break;
  }
  if (L.splits > 1) {
    const dim3 mgrid(unsigned(M), unsigned((shape.num_q_heads + kMergeWarps - 1) / kMergeWarps));
    attention_merge_kernel<T><<<mgrid, kMergeWarps * 32, 0, stream>>>(gate, shape, meta, L, out);
    MOESERVE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void set_attention_decode_variant(int variant) {
  if (variant < 0 || variant > 2)
    throw Error("attention: decode variant must be 0, 1 or 2, got " + std::to_string(variant));
  g_decode_variant.store(variant, std::memory_order_relaxed);
}

int attention_decode_variant() { return decode_variant(); }

void set_attention_decode_stages(int stages) {
  if (stages < 1 || stages > 2)
    throw Error("attention: decode stages must be 1 or 2, got " + std::to_string(stages));
  g_decode2_stages.store(stages, std::memory_order_relaxed);
}
int attention_decode_stages() { return g_decode2_stages.load(std::memory_order_relaxed); }

void attention_prepare(const bf16* qg, const bf16* k, const bf16* v, const float* q_norm_w, const float* k_norm_w,
                       const float* inv_freq, const AttentionShape& shape, const StepMeta& meta, KvCacheView cache,
                       bf16* q_out, bf16* gate_out, cudaStream_t stream) {
  launch_prepare(qg, k, v, q_norm_w, k_norm_w, inv_freq, shape, meta, cache, q_out, gate_out, stream);
}

void attention_prepare(const float* qg, const float* k, const float* v, const float* q_norm_w, const float* k_norm_w,
                       const float* inv_freq, const AttentionShape& shape, const StepMeta& meta, KvCacheView cache,
                       float* q_out, float* gate_out, cudaStream_t stream) {
  launch_prepare(qg, k, v, q_norm_w, k_norm_w, inv_freq, shape, meta, cache, q_out, gate_out, stream);
}

size_t paged_attention_workspace_bytes(const AttentionShape& shape, int max_tokens, int max_context) {
  try {
    decode2_ctas_per_sm();  // the decode kernels' set-up, here outside any graph capture
    detail::attention_decode_tc_prepare();
  } catch (const std::exception&) {
    cudaGetLastError();  // no usable device now: the first launch tries again
  }
  const size_t slots = chunk_slots(max_context);
  if (slots <= 1 || max_tokens <= 0) return 0;  // every query fits one chunk: nothing to merge
  return size_t(std::min(max_tokens, kSplitMaxTokens)) * split_bytes_per_token(shape, slots);
}

void paged_attention(const bf16* q, const bf16* gate, const AttentionShape& shape, const StepMeta& meta,
                     KvCacheView cache, float scale, void* workspace, size_t workspace_bytes, bf16* out,
                     cudaStream_t stream) {
  launch_attention(q, gate, shape, meta, cache, scale, workspace, workspace_bytes, out, stream);
}

void paged_attention(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                     KvCacheView cache, float scale, void* workspace, size_t workspace_bytes, float* out,
                     cudaStream_t stream) {
  launch_attention(q, gate, shape, meta, cache, scale, workspace, workspace_bytes, out, stream);
}

bool paged_attention_generated_prepared(const float* qg, const float* k, const float* v, const float* q_norm_w,
                                        const float* k_norm_w, const float* inv_freq, const AttentionShape& shape,
                                        const StepMeta& meta, KvCacheView cache, float scale, void* workspace,
                                        size_t workspace_bytes, float* out, cudaStream_t stream) {
  if (meta.num_tokens == 0) return true;
  check_shape(shape);
  if (shape.head_dim % kLaneDims != 0 || cache.head_dim != shape.head_dim || cache.num_kv_heads != shape.num_kv_heads)
    return false;
  AttnLaunch L{};
  size_t items = 0;
  if (!decode2_plan(shape, meta, cache, scale, workspace, workspace_bytes, L, items)) return false;
  if (L.chunk_stride > 1 && !L.fold_in_kernel) return false;  // the merge kernel would read the gate buffer
  launch_decode2<float>(items, nullptr, nullptr, shape, meta, cache, L, out, stream,
                        PrepIn<float>{qg, k, v, q_norm_w, k_norm_w, inv_freq});
  return true;
}

bool paged_attention_generated_tc_supported(const AttentionShape& shape) {
  return detail::attention_decode_tc_supported(shape);
}

void paged_attention_generated(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                               KvCacheView cache, float scale, bool tensor_cores, void* workspace,
                               size_t workspace_bytes, float* out, cudaStream_t stream) {
  if (!tensor_cores || !detail::attention_decode_tc_supported(shape)) {
    launch_attention(q, gate, shape, meta, cache, scale, workspace, workspace_bytes, out, stream);
    return;
  }
  const int M = meta.num_tokens;
  if (M == 0) return;
  check_shape(shape);
  if (cache.head_dim != shape.head_dim || cache.num_kv_heads != shape.num_kv_heads)
    throw Error("attention: the KV cache geometry does not match the attention shape");
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(gate) | reinterpret_cast<uintptr_t>(out)) % 16)
    throw Error("attention (tensor-core decode): q, gate and out must be 16-byte aligned");
  const int nq = shape.num_q_heads, hd = shape.head_dim;
  const size_t slots = chunk_slots((long long)meta.max_blocks_per_seq * cache.block_size);
  const size_t per_token = split_bytes_per_token(shape, slots);
  detail::DecodeTcArgs a;
  a.cache = cache;
  a.nq = nq;
  a.nkv = shape.num_kv_heads;
  a.group = nq / shape.num_kv_heads;
  a.head_blocks = (a.group + 15) / 16;
  a.scale_log2 = scale * kLog2e;
  a.chunk_stride = int(slots);
  a.meta = meta;
  a.q = q;
  a.gate = gate;
  a.out = out;
  // Enough (token, kv head, head block) triples to fill the GPU: a CTA per triple walks the whole
  // range and folds its chunks itself, in one launch.
  if (slots == 1 || detail::attention_decode_tc_whole_ranges(M, a.nkv, a.head_blocks)) {
    a.whole_range = true;
    detail::attention_decode_tc(a, hd, size_t(M) * a.nkv * a.head_blocks, stream);
    return;
  }
  // Otherwise a CTA per chunk. Tokens per launch: at most kDecodeTcMaxTokens, and as many as the
  // workspace holds partials for.
  int group = detail::kDecodeTcMaxTokens;
  {
    const size_t fit = workspace != nullptr ? workspace_bytes / per_token : 0;
    if (fit == 0)
      throw Error("attention (tensor-core decode): the workspace holds no token's chunk partials (" +
                  std::to_string(workspace_bytes) + " bytes, " + std::to_string(per_token) + " per token)");
    group = int(std::min<size_t>(size_t(group), fit));
  }
  AttnLaunch L{};  // the merge kernel's view of the same workspace
  L.chunk_stride = int(slots);
  // Groups of tokens, each a launch (and a merge) of its own: a token's arithmetic does not depend
  // on its group, so a step of any size gives every token the bits it gets alone.
  for (int r0 = 0; r0 < M; r0 += group) {
    const int n = std::min(group, M - r0);
    StepMeta sub = meta;
    sub.num_tokens = n;
    sub.token_pos = meta.token_pos + r0;
    sub.token_seq = meta.token_seq + r0;
    const size_t row = size_t(r0) * nq * hd;
    a.meta = sub;
    a.q = q + row;
    a.gate = gate + row;
    a.out = out + row;
    a.ws_acc = static_cast<float*>(workspace);
    a.ws_ml = a.ws_acc + size_t(n) * nq * slots * hd;
    detail::attention_decode_tc(a, hd, size_t(n) * a.nkv * a.head_blocks * slots, stream);
    {  // tokens with several chunks: fold the partials (waits for the decode grid)
      L.ws_acc = a.ws_acc;
      L.ws_ml = a.ws_ml;
      const dim3 mgrid(unsigned(n), unsigned((nq + kMergeWarps - 1) / kMergeWarps));
      launch_pdl(true, attention_merge_kernel<float>, mgrid, dim3(kMergeWarps * 32), 0, stream, a.gate, shape, sub, L,
                 a.out);
    }
  }
}

}  // namespace moeserve::cuda
