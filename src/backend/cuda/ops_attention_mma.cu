// paged_attention_prefill (ops_attention.h): gated causal attention of prompt-class tokens over the
// paged bf16 KV cache on tensor cores. This file holds the 4-warp kernel (variant 0, and the
// fallback where the wide kernel does not fit: hd 256 on the DGX Spark) and the dispatch; the
// wide 8-warp kernel (variant 1, the default) is in ops_attention_mma_wide.cu and gives the same
// bits under the arithmetic contract below. The 4-warp kernel uses
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 and ldmatrix (sm_80+, no wgmma / TMA,
// <= 99 KB of shared memory: H200 (sm_90) and DGX Spark (sm_121)).
//
// Data layout. q, gate, out: f32 [M, nq·hd] row-major (16-byte aligned), q head h at columns
// [h·hd, (h+1)·hd); q head h reads kv head h / (nq/nkv). KV cache: bf16 [num_blocks][nkv][block_size][hd]
// (KvCacheView), block tables in StepMeta. hd ∈ {64, 128, 256} (a template parameter).
//
// Parallelisation. One CTA (4 warps) per (query tile, kv head, q-head block). A query tile is up to
// T consecutive tokens of ONE sequence; the CTA's 64 MMA rows are (token, q head) pairs
// row = token·H + head over the H = min(group, 64) q heads of the kv head's GQA group
// (group 16: 4 tokens x 16 heads, so warp w holds all 16 heads of token w), T = 64 / H. Every K/V
// tile of the sequence is copied once into shared memory and serves all 64 rows. Warp w owns rows
// 16w .. 16w+15 (one m16 tile) and computes, per KV tile of kBc = 32 positions:
//   S (16 x 32)  = Q_w · Kᵀ        hd/16 k16 steps x 4 n8 tiles x 2 MMAs (hi, lo),
//   P            = exp2(S − m)     in registers (the S accumulator layout is the A layout of P),
//   O (16 x hd) += P · V           2 k16 steps x hd/8 n8 tiles x 2 MMAs (hi, lo).
// O stays in registers (hd/2 floats per thread); Q (hi and lo planes) lives in shared memory.
// Shared memory (bf16, rows XOR-swizzled in 16-byte chunks: chunk c of row r is stored at chunk
// c ^ (r & 7), so the 8 row addresses of an ldmatrix hit 8 different bank groups):
//   Q hi [64][hd], Q lo [64][hd], K [32][hd], V [32][hd]   = 384·hd bytes (96 KB at hd 256).
// Pipeline (cp.async.cg, one K and one V buffer): while the warps compute S of tile t, V of tile t
// is in flight; while they compute P·V of tile t, K of tile t+1 is in flight. Grid: 1-D, one slot
// per (token of the range, kv head, head block); a slot works when its token starts a query tile
// of its sequence (every T-th token from the sequence's first one in the step), the others exit.
// Slots are ordered last token first, so the longest tiles start first.
//
// Arithmetic (batch- and chunk-invariant; a row's result is a function of its token's position p,
// its q / gate row and the cache only):
//   q' = q ⊗ (scale·log2 e) in f32, then q' = hi + lo with hi = bf16_rn(q'), lo = bf16_rn(q' − hi);
//   KV tiles at FIXED absolute positions [32t, 32t + 32), t = 0, 1, ... in ascending order, from
//   position 0 up to the tile holding p (a CTA may walk further for its later tokens: see below);
//   per tile: S(j) = for each k16 step in ascending dims: C = mma(hi, K, C), then C = mma(lo, K, C)
//     (C from 0); positions j > p are excluded by selects (S → −inf, P → 0), never by arithmetic;
//     tmax = max over the tile (exact, any order); m' = max(m, tmax);
//     corr = (m' == m) ? 1 : ex2.approx(m − m'); P(j) = ex2.approx(S(j) − m') (0 when masked);
//     l = fma(l, corr, rowsum) with rowsum over the tile in a fixed position order (each of the 4
//     threads of a quad sums its 8 positions in ascending n8 tile, column order, then two xor
//     shuffles: a + b == b + a, so all four get the same bits);
//     O = O ⊗ corr (skipped when corr == 1: exact), then for each k16 step of positions in
//     ascending order: O = mma(hi(P), V, O), O = mma(lo(P), V, O) (P split like q);
//   out = (O ÷ l) ⊗ sigmoid(gate), sigmoid(g) = 1 ÷ (1 ⊕ ex2.approx(−g ⊗ log2 e)).
//   Each MMA row is one (token, q head) pair and an m16n8k16 MMA computes every C element from its
//   own A row, B column and old value, so rows never mix. A tile entirely after p (walked because a
//   later token of the CTA needs it) is an exact no-op for the row: tmax = −inf, m' = m, corr = 1
//   (select), P = 0, l = fma(l, 1, 0) = l, O ⊗ 1 = O and the MMAs add exact zero products (V is
//   finite: positions beyond the CTA's last one are zero-filled, never stale). Warps skip tiles
//   past all of their rows (warp-uniform; group >= 16 makes that every extra tile). Every f32 step
//   is an explicit round-to-nearest intrinsic or ex2.approx, so the compiler cannot contract
//   differently in different instantiations. Hence one pass, any chunking, one token per step and
//   any company in the step give bit-identical outputs. (The bits differ from paged_attention's
//   CUDA-core kernel: different tiles and products.)
//
// Roofline. Useful work per (token, q head) at position p: 4·(p+1)·hd FLOP (q·K and P·V); the
// tensor cores execute 2x that (hi and lo MMAs) plus the masked tail of the last 32-position tile
// and, for group < 16, tiles walked for the CTA's later tokens. An 8K prompt at the 122B shapes:
// 12 layers x 8192²/2 x 32 heads x 256 x 4 ≈ 13 TFLOP useful, ≈ 26 TFLOP executed. Bytes: K and V
// tiles, 2·32·hd·2 B (32 KB at hd 256) per (CTA, tile), i.e. per 64 rows, read from L2 (a
// sequence's cache of one kv head is read by all of its CTAs; HBM sees it about once); plus q, gate
// and out, 3·hd·4 B per row, once. Shared-memory reads per warp and tile: Q 16·hd·4 B, K and V
// 32·hd·2 B each, i.e. 128·hd B per 2048·hd MMA FLOP.
#include <atomic>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_attention.h"
#include "backend/cuda/ops_attention_mma_common.cuh"
#include "backend/cuda/ops_attention_mma_wide.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda {
namespace {

using namespace mma_frag;  // split2, ldmatrix, mma_bf16, cp.async
using namespace attn_mma;  // kBc, kSN, kLog2e, swz and the tile steps

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // MMA rows per CTA: (token, q head) pairs

template <int kHd>
constexpr size_t smem_bytes() {
  return size_t(2 * kRows + 2 * kBc) * kHd * sizeof(bf16);
}
static_assert(smem_bytes<256>() <= 99 * 1024, "DGX Spark: <= 99 KB of shared memory per block");

struct PrefillArgs {
  const float* q;
  const float* gate;
  float* out;
  StepMeta meta;
  KvCacheView cache;
  int nq, nkv, group;
  int heads_per_cta;  // H
  int head_blocks;    // ceil(group / H)
  int tile_tokens;    // T = 64 / H
  int seq_begin, seq_end, row_begin, row_count;
  float scale_log2;
};

// ---- device helpers ---------------------------------------------------------------------------

__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait0() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// ---- the kernel -------------------------------------------------------------------------------

template <int kHd>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(PrefillArgs a) {
  static_assert(kHd % 64 == 0 && kHd <= 256, "head_dim: a multiple of 64 up to 256");
  constexpr int kChunks = kHd / 8;  // 16-byte chunks per row
  constexpr int kON = kHd / 8;      // n8 tiles of O per warp

  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* const sq_hi = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sq_lo = sq_hi + kRows * kHd;
  bf16* const sk = sq_lo + kRows * kHd;
  bf16* const sv = sk + kBc * kHd;
  const uint32_t a_qhi = uint32_t(__cvta_generic_to_shared(sq_hi));
  const uint32_t a_qlo = uint32_t(__cvta_generic_to_shared(sq_lo));
  const uint32_t a_k = uint32_t(__cvta_generic_to_shared(sk));
  const uint32_t a_v = uint32_t(__cvta_generic_to_shared(sv));

  const StepMeta& meta = a.meta;
  const KvCacheView& cache = a.cache;

  // ---- which (query tile, kv head, head block) ----
  const int ny = a.nkv * a.head_blocks;
  const int slot = int(blockIdx.x);
  const int y = slot % ny;
  const int x = a.row_begin + a.row_count - 1 - slot / ny;  // last tokens first
  const int seq = meta.token_seq[x];
  if (seq < a.seq_begin || seq >= a.seq_end) return;  // CTA-uniform (a token outside the range)
  const int first = meta.seq_token_start[seq], end = meta.seq_token_start[seq + 1];
  if ((x - first) % a.tile_tokens != 0) return;  // CTA-uniform: not the first token of a tile
  const int ntok = min(a.tile_tokens, end - x);
  const int kvh = y / a.head_blocks, hb = y % a.head_blocks;
  const int H = a.heads_per_cta;
  const int heads_here = min(H, a.group - hb * H);
  const int p_hi = meta.token_pos[x + ntok - 1];  // the tile's last (largest) position

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;

  // Row r of the CTA -> (token x + r / H, q head kvh·group + hb·H + r % H); rows past the tile or
  // the group are padding (zero q, position −1: everything masked, never stored).
  auto row_valid = [&](int r) { return r / H < ntok && r % H < heads_here; };
  auto row_oh = [&](int r) {  // token·nq + q head
    return size_t(x + r / H) * a.nq + size_t(kvh * a.group + hb * H + r % H);
  };

  // ---- Q: f32 -> ·scale·log2e -> hi / lo planes ----
  for (int c = tid; c < kRows * (kHd / 4); c += kThreads) {
    const int r = c / (kHd / 4), d = (c % (kHd / 4)) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row_valid(r)) v = *reinterpret_cast<const float4*>(a.q + row_oh(r) * kHd + d);
    uint2 hi, lo;
    split2(__fmul_rn(v.x, a.scale_log2), __fmul_rn(v.y, a.scale_log2), hi.x, lo.x);
    split2(__fmul_rn(v.z, a.scale_log2), __fmul_rn(v.w, a.scale_log2), hi.y, lo.y);
    const int off = swz<kHd>(r, d >> 3) + (d & 7);
    *reinterpret_cast<uint2*>(sq_hi + off) = hi;
    *reinterpret_cast<uint2*>(sq_lo + off) = lo;
  }

  // This thread's two rows (g and g + 8 of the warp's m16 tile) and the warp's last position.
  int rpos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 16 * warp + g + 8 * i;
    rpos[i] = row_valid(r) ? meta.token_pos[x + r / H] : -1;
  }
  const int warp_pos = __reduce_max_sync(0xffffffffu, max(rpos[0], rpos[1]));

  // ---- K / V tile loads (positions > p_hi zero-filled: their blocks may not exist) ----
  const int32_t* table = meta.block_tables + size_t(seq) * meta.max_blocks_per_seq;
  auto load_tile = [&](const bf16* src_base, uint32_t dst_base, int t0) {
    for (int c = tid; c < kBc * kChunks; c += kThreads) {
      const int j = c / kChunks, ch = c % kChunks;
      const int p = t0 + j;
      const uint32_t dst = dst_base + uint32_t(swz<kHd>(j, ch)) * 2u;
      if (p <= p_hi) {
        const size_t off =
            ((size_t(table[p / cache.block_size]) * cache.num_kv_heads + kvh) * cache.block_size +
             p % cache.block_size) * size_t(kHd) + size_t(ch) * 8;
        cp_async16(dst, src_base + off, 16);
      } else {
        cp_async16(dst, src_base, 0);
      }
    }
  };

  // ---- per-lane ldmatrix offsets (bytes; the chunk index is added per k step) ----
  // A (Q, x4): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
  const int qa_row = 16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8, qa_chunk = lane >> 4;
  // B of S (K rows = positions, dims contiguous; x4 = two n8 tiles): matrices (pos 0-7, k 0-7),
  // (pos 0-7, k 8-15), (pos 8-15, k 0-7), (pos 8-15, k 8-15).
  const int kb_row = (lane >> 4) * 8 + (lane & 7), kb_chunk = (lane >> 3) & 1;
  // B of P·V (V rows = positions = k, dims = n; .trans; x4 = two n8 tiles): matrices
  // (pos 0-7, dims 0-7), (pos 8-15, dims 0-7), (pos 0-7, dims 8-15), (pos 8-15, dims 8-15).
  const int vb_row = ((lane >> 3) & 1) * 8 + (lane & 7), vb_chunk = lane >> 4;

  float o[kON][4];
  zero_fragments(o);
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  const int n_tiles = p_hi / kBc + 1;
  // Commit groups: K0, V0, K1, V1, ... (one of each per tile, empty past the end).
  load_tile(cache.k, a_k, 0);
  cp_async_commit();
  load_tile(cache.v, a_v, 0);
  cp_async_commit();

  for (int t = 0; t < n_tiles; ++t) {
    const int t0 = t * kBc;
    const bool active = t0 <= warp_pos;  // warp-uniform: some row of the warp sees this tile
    cp_async_wait1();                     // K_t has landed (V_t may still be in flight)
    __syncthreads();                      // everyone's K_t copies, and Q on the first tile

    float s[kSN][4];
    zero_fragments(s);
    if (active) {
      // S = Q · Kᵀ: attn_mma::qk_tile's chain, written out here (calling it moves the scheduling of
      // this kernel's O rescale and costs a register at hd 128 on sm_121).
#pragma unroll 4
      for (int ks = 0; ks < kHd / 16; ++ks) {
        uint32_t ah[4], al[4];
        const uint32_t qoff = uint32_t(swz<kHd>(qa_row, 2 * ks + qa_chunk)) * 2u;
        ldmatrix_x4(a_qhi + qoff, ah);
        ldmatrix_x4(a_qlo + qoff, al);
        uint32_t b[kSN][2];
#pragma unroll
        for (int np = 0; np < kSN / 2; ++np) {
          uint32_t r4[4];
          ldmatrix_x4(a_k + uint32_t(swz<kHd>(16 * np + kb_row, 2 * ks + kb_chunk)) * 2u, r4);
          b[2 * np][0] = r4[0], b[2 * np][1] = r4[1], b[2 * np + 1][0] = r4[2], b[2 * np + 1][1] = r4[3];
        }
#pragma unroll
        for (int n = 0; n < kSN; ++n) mma_bf16(s[n], ah, b[n][0], b[n][1]);
#pragma unroll
        for (int n = 0; n < kSN; ++n) mma_bf16(s[n], al, b[n][0], b[n][1]);
      }
    }
    __syncthreads();  // every warp is done with K_t
    if (t + 1 < n_tiles) load_tile(cache.k, a_k, t0 + kBc);
    cp_async_commit();
    cp_async_wait1();  // V_t has landed (K_{t+1} may still be in flight)
    __syncthreads();

    if (active) {
      // Online softmax of the tile (s[n][e]: position t0 + 8n + 2·tq + (e & 1) of row g + 8·(e >> 1)),
      // then O = O ⊗ corr + P · V.
      float corr[2];
      tile_softmax(s, m_run, l_run, corr, [&](int i, int n, int c) { return t0 + 8 * n + 2 * tq + c <= rpos[i]; });
      rescale_o(o, corr);
      pv_tile(o, s, [&](int ks, int dp) {
        return a_v + uint32_t(swz<kHd>(16 * ks + vb_row, 2 * dp + vb_chunk)) * 2u;
      });
    }
    __syncthreads();  // every warp is done with V_t
    if (t + 1 < n_tiles) load_tile(cache.v, a_v, t0 + kBc);
    cp_async_commit();
  }
  cp_async_wait0();

  // ---- out = O / l · sigmoid(gate) ----
  store_gated_output<kHd>(o, l_run, rpos, tq, a, [&](int i) { return row_oh(16 * warp + g + 8 * i) * kHd; });
}

// ---- host side --------------------------------------------------------------------------------

// Opts the kernel in to > 48 KB of dynamic shared memory, once per device.
template <int kHd>
void opt_in() {
  constexpr size_t smem = smem_bytes<kHd>();
  if constexpr (smem > 48 * 1024) opt_in_dynamic_smem<attention_prefill_kernel<kHd>>(smem);
}

template <int kHd>
void launch(const PrefillArgs& args, unsigned grid, cudaStream_t stream) {
  opt_in<kHd>();
  attention_prefill_kernel<kHd><<<grid, kThreads, smem_bytes<kHd>(), stream>>>(args);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

// The prefill variant (set_attention_prefill_variant).
std::atomic<int> g_prefill_variant{1};

}  // namespace

void set_attention_prefill_variant(int variant) {
  if (variant < 0 || variant > 1)
    throw Error("attention: prefill variant must be 0 or 1, got " + std::to_string(variant));
  g_prefill_variant.store(variant, std::memory_order_relaxed);
}

int attention_prefill_variant() { return g_prefill_variant.load(std::memory_order_relaxed); }

void paged_attention_prefill_prepare() {
  opt_in<64>();
  opt_in<128>();
  opt_in<256>();
  detail::attention_prefill_wide_prepare();
}

size_t paged_attention_prefill_workspace_bytes(const AttentionShape&, int, int) {
  return 0;  // no split over the KV length: every CTA walks its whole range
}

bool paged_attention_prefill_supported(const AttentionShape& shape) {
  const int hd = shape.head_dim;
  return (hd == 64 || hd == 128 || hd == 256) && shape.num_kv_heads > 0 && shape.num_q_heads > 0 &&
         shape.num_q_heads % shape.num_kv_heads == 0;
}

void paged_attention_prefill(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                             KvCacheView cache, float scale, int seq_begin, int seq_end, int row_begin, int row_count,
                             void* /*workspace*/, size_t /*workspace_bytes*/, float* out, cudaStream_t stream) {
  if (row_count <= 0 || seq_end <= seq_begin) return;
  const int hd = shape.head_dim;
  if (hd != 64 && hd != 128 && hd != 256)
    throw Error("paged_attention_prefill: head_dim must be 64, 128 or 256, got " + std::to_string(hd));
  if (shape.num_kv_heads <= 0 || shape.num_q_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0)
    throw Error("paged_attention_prefill: " + std::to_string(shape.num_q_heads) +
                " query heads are not a multiple of " + std::to_string(shape.num_kv_heads) + " KV heads");
  if (cache.head_dim != hd || cache.num_kv_heads != shape.num_kv_heads)
    throw Error("paged_attention_prefill: the KV cache geometry does not match the attention shape");
  if (row_begin < 0 || row_begin + row_count > meta.num_tokens || seq_begin < 0 || seq_end > meta.num_seqs)
    throw Error("paged_attention_prefill: token or sequence range outside the step");
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(gate) | reinterpret_cast<uintptr_t>(out)) % 16)
    throw Error("paged_attention_prefill: q, gate and out must be 16-byte aligned");
  if (attention_prefill_variant() == 1 && detail::attention_prefill_wide_fits(hd)) {
    detail::attention_prefill_wide(q, gate, shape, meta, cache, scale, seq_begin, seq_end, row_begin, row_count,
                                   out, stream);
    return;
  }
  PrefillArgs a{};
  a.q = q;
  a.gate = gate;
  a.out = out;
  a.meta = meta;
  a.cache = cache;
  a.nq = shape.num_q_heads;
  a.nkv = shape.num_kv_heads;
  a.group = a.nq / a.nkv;
  a.heads_per_cta = a.group < kRows ? a.group : kRows;
  a.head_blocks = (a.group + a.heads_per_cta - 1) / a.heads_per_cta;
  a.tile_tokens = kRows / a.heads_per_cta;
  a.seq_begin = seq_begin;
  a.seq_end = seq_end;
  a.row_begin = row_begin;
  a.row_count = row_count;
  a.scale_log2 = scale * kLog2e;
  const long long slots = (long long)row_count * a.nkv * a.head_blocks;
  if (slots > 0x7fffffffLL) throw Error("paged_attention_prefill: too many tokens for the launch grid");
  switch (hd) {
    case 64: launch<64>(a, unsigned(slots), stream); break;
    case 128: launch<128>(a, unsigned(slots), stream); break;
    default: launch<256>(a, unsigned(slots), stream); break;
  }
}

}  // namespace moeserve::cuda
