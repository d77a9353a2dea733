// The wide paged_attention_prefill kernel (variant 1, the default where it fits): gated causal
// attention of prompt-class tokens over the paged bf16 KV cache on tensor cores (mma.sync m16n8k16
// bf16, ldmatrix, cp.async; sm_80+ PTX, no wgmma / TMA). It computes exactly what the 4-warp
// kernel of ops_attention_mma.cu computes, bit for bit (same KV tiles at fixed positions, same
// MMA chains, same softmax steps: the arithmetic contract in that file's header holds unchanged);
// what differs is how the work is laid out:
//   - 8 warps, 128 MMA rows per CTA (group 16: 8 tokens x 16 heads), so each K / V tile that is
//     copied into shared memory feeds twice the MMAs (half the cp.async work and L2 reads per MMA);
//   - K and V double-buffered (two stages of 32 positions each): tile t+1 is in flight during all
//     of tile t's work, one __syncthreads per tile (the 4-warp kernel has one buffer each and four);
//   - cheaper bookkeeping: the source offset of a KV row is computed once for K and V (a shift
//     when block_size is a power of two), ldmatrix addresses are 12 per-lane registers plus
//     immediates (the XOR swizzle only touches the low 3 chunk bits), the causal selects are
//     dropped on tiles every row of the warp sees whole, and the grid holds one CTA per query tile
//     (not one per token with the non-starting ones exiting).
//
// Data layout. q, gate, out: f32 [M, nq·hd] row-major (16-byte aligned), q head h at columns
// [h·hd, (h+1)·hd) reads kv head h / (nq/nkv). KV cache: bf16 [num_blocks][nkv][block_size][hd]
// (KvCacheView), block tables in StepMeta. hd ∈ {64, 128, 256}.
//
// Parallelisation. One CTA (8 warps) per (query tile, kv head, q-head block); a query tile is up
// to T = 128 / H consecutive tokens of one sequence starting at its first token in the step, H =
// min(group, 128) q heads of the kv head's group; row r = token·H + head (rows past the tile or the
// group are padding: zero q, position −1). Warp w owns rows 16w .. 16w+15 (S 16 x 32 and O 16 x hd
// in registers, as in the 4-warp kernel). Grid: 1-D, ny = nkv·head_blocks CTAs per query tile,
// tiles numbered from the last one of the last sequence backwards (longest first); the grid is an
// upper bound (row_count / T + sequences) and the surplus CTAs exit. Registers (sm_90, no spills):
// ~250 at hd 256 (one CTA, 8 warps per SM), 128 at hd 128 (two CTAs), ~113 at hd 64.
// Shared memory (bf16, rows XOR-swizzled in 16-byte chunks as in the 4-warp kernel):
//   Q hi [128][hd], Q lo [128][hd], 2 stages x (K [32][hd], V [32][hd])  = 768·hd bytes:
//   192 KB at hd 256 (one CTA per SM on the H200; more than the DGX Spark's 99 KB, where
//   paged_attention_prefill keeps the 4-warp kernel), 96 KB at hd 128, 48 KB at hd 64.
// Pipeline: prologue copies tile 0; iteration t waits for tile t, syncs (tile t visible, every warp
// done with tile t−1, whose stage tile t+1 then overwrites), issues tile t+1, computes tile t.
//
// Roofline (as the 4-warp kernel's, per tile): MMA work per warp 2·(16·32·hd·2) FLOP x 2 (hi, lo);
// K and V tiles 2·32·hd·2 B (32 KB at hd 256) per (CTA, tile), now per 128 rows, read from L2;
// q, gate, out 3·hd·4 B per row once. Shared-memory reads per warp and tile: Q 16·hd·4 B, K and V
// 32·hd·2 B each (128·hd B per 2048·hd MMA FLOP), writes 128·hd B per CTA and tile.
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_attention_mma_common.cuh"
#include "backend/cuda/ops_attention_mma_wide.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda::detail {
namespace {

using namespace mma_frag;
using namespace attn_mma;  // kBc, kSN, kLog2e, swz and the tile steps (shared with the 4-warp kernel)

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // MMA rows per CTA
constexpr int kStages = 2;

constexpr size_t smem_bytes(int hd) { return size_t(2 * kRows + 2 * kStages * kBc) * size_t(hd) * 2; }

struct WideArgs {
  const float* q;
  const float* gate;
  float* out;
  StepMeta meta;
  KvCacheView cache;
  int nq, nkv, group;
  int heads_per_cta;  // H
  int head_blocks;    // ceil(group / H)
  int tile_tokens;    // T = 128 / H
  int seq_begin, seq_end, row_begin, row_end;
  int bs_shift;  // log2(block_size) when it is a power of two, else −1
  float scale_log2;
};

// CTAs per SM the registers are budgeted for: hd 256 needs ~250 registers (one CTA); hd <= 128
// fits two CTAs' shared memory on the H200, but only one on the DGX Spark (<= 99 KB), where a
// 128-register cap would only spill.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define MOESERVE_WIDE_MIN_CTAS(hd) 1
#else
#define MOESERVE_WIDE_MIN_CTAS(hd) ((hd) == 256 ? 1 : 2)
#endif

template <int kHd>
__global__ void __launch_bounds__(kThreads, MOESERVE_WIDE_MIN_CTAS(kHd)) attention_prefill_wide_kernel(WideArgs a) {
  static_assert(kHd % 64 == 0 && kHd <= 256, "head_dim: a multiple of 64 up to 256");
  constexpr int kChunks = kHd / 8;  // 16-byte chunks per row
  constexpr int kON = kHd / 8;      // n8 tiles of O per warp
  constexpr uint32_t kRowBytes = kHd * 2;
  constexpr uint32_t kPlaneBytes = kRows * kRowBytes;  // one Q plane
  constexpr uint32_t kTileBytes = kBc * kRowBytes;     // one K or V tile
  constexpr int kLdRowStep = kThreads / kChunks;       // KV rows copied per pass of the CTA
  constexpr int kLdIters = kBc / kLdRowStep;
  static_assert(kLdRowStep % 8 == 0 && kBc % kLdRowStep == 0, "copy passes keep the swizzle phase");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* const sq_hi = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sq_lo = sq_hi + kRows * kHd;
  const uint32_t a_q = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t a_kv = a_q + 2 * kPlaneBytes;  // stage s: K at a_kv + 2s·kTileBytes, V after it

  const StepMeta& meta = a.meta;
  const KvCacheView& cache = a.cache;

  // ---- which (query tile, kv head, head block): tile k counted from the end ----
  const int ny = a.nkv * a.head_blocks;
  const int y = int(blockIdx.x) % ny;
  int k = int(blockIdx.x) / ny;
  const int T = a.tile_tokens;
  // A sequence's rows are [first, end) clamped to the call's row range (which, per the API, holds
  // exactly the range's sequences: the clamp only guards the grid bound).
  int x = -1, seq = a.seq_end - 1, end = 0;
  for (; seq >= a.seq_begin; --seq) {  // CTA-uniform
    const int first = max(meta.seq_token_start[seq], a.row_begin);
    end = min(meta.seq_token_start[seq + 1], a.row_end);
    const int nt = end > first ? (end - first + T - 1) / T : 0;
    if (k < nt) {
      x = first + (nt - 1 - k) * T;
      break;
    }
    k -= nt;
  }
  if (x < 0) return;  // a surplus CTA of the upper-bound grid
  const int ntok = min(T, end - x);
  const int kvh = y / a.head_blocks, hb = y % a.head_blocks;
  const int H = a.heads_per_cta;
  const int heads_here = min(H, a.group - hb * H);
  const int p_hi = meta.token_pos[x + ntok - 1];  // the tile's last (largest) position

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;

  auto row_valid = [&](int r) { return r / H < ntok && r % H < heads_here; };
  auto row_oh = [&](int r) {  // token·nq + q head
    return size_t(x + r / H) * a.nq + size_t(kvh * a.group + hb * H + r % H);
  };

  // ---- K / V tile copies (positions > p_hi zero-filled: their blocks may not exist) ----
  // Thread tid copies chunk ld_ch of rows ld_row0 + i·kLdRowStep of both K and V; the rows share
  // their swizzle phase (kLdRowStep is a multiple of 8), so the destinations are immediates apart.
  const int ld_ch = tid % kChunks, ld_row0 = tid / kChunks;
  const uint32_t ld_dst = uint32_t(ld_row0) * kRowBytes + (uint32_t(ld_ch ^ (ld_row0 & 7)) << 4);
  // (Few long-lived registers here: the cache pointers and strides are re-read from the kernel
  // parameters, which live in the constant bank, so that hd 128 fits 128 registers.)
  const int head_off = (kvh * cache.block_size) * kHd + ld_ch * 8;  // < 2^31: one block's elements
  auto load_tile = [&](int t) {
    const uint32_t dk = a_kv + uint32_t(t & 1) * 2u * kTileBytes + ld_dst, dv = dk + kTileBytes;
#pragma unroll
    for (int i = 0; i < kLdIters; ++i) {
      const int p = t * kBc + ld_row0 + i * kLdRowStep;
      const uint32_t o = uint32_t(i * kLdRowStep) * kRowBytes;
      if (p <= p_hi) {
        int blk, in;
        if (a.bs_shift >= 0) {
          blk = p >> a.bs_shift;
          in = p & ((1 << a.bs_shift) - 1);
        } else {
          blk = p / cache.block_size;
          in = p - blk * cache.block_size;
        }
        const int32_t* const table = meta.block_tables + size_t(seq) * meta.max_blocks_per_seq;
        const size_t off = size_t(table[blk]) * (size_t(cache.num_kv_heads) * cache.block_size * kHd) +
                           size_t(in * kHd + head_off);
        cp_async16(dk + o, cache.k + off, 16);
        cp_async16(dv + o, cache.v + off, 16);
      } else {
        cp_async16(dk + o, cache.k, 0);
        cp_async16(dv + o, cache.v, 0);
      }
    }
  };

  const int n_tiles = p_hi / kBc + 1;
  load_tile(0);  // in flight while Q is converted
  cp_async_commit();

  // ---- Q: f32 -> ·scale·log2e -> hi / lo planes ----
  // Thread tid converts columns qd .. qd+3 of rows q_row0 + i·kQRowStep (unrolled so that several
  // loads are in flight: one CTA per SM at hd 256, nothing else hides this prologue).
  constexpr int kQRowStep = kThreads / (kHd / 4);
  static_assert(kThreads % (kHd / 4) == 0 && kRows % kQRowStep == 0, "Q conversion passes");
  const int q_row0 = tid / (kHd / 4), qd = (tid % (kHd / 4)) * 4;
#pragma unroll 4
  for (int r = q_row0; r < kRows; r += kQRowStep) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row_valid(r)) v = *reinterpret_cast<const float4*>(a.q + row_oh(r) * kHd + qd);
    uint2 hi, lo;
    split2(__fmul_rn(v.x, a.scale_log2), __fmul_rn(v.y, a.scale_log2), hi.x, lo.x);
    split2(__fmul_rn(v.z, a.scale_log2), __fmul_rn(v.w, a.scale_log2), hi.y, lo.y);
    const int off = swz<kHd>(r, qd >> 3) + (qd & 7);
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
  const int warp_min = __reduce_min_sync(0xffffffffu, min(rpos[0], rpos[1]));

  // ---- per-lane ldmatrix byte offsets ----
  // Chunk c = 2·ks + sel of a row r is stored at chunk c ^ (r & 7); with c = 8·(ks >> 2) +
  // (2·(ks & 3) + sel) and r & 7 < 8 that is 8·(ks >> 2) + ((2·(ks & 3) + sel) ^ (r & 7)): four
  // per-lane offsets (ks & 3 = 0..3) plus the immediate 128·(ks >> 2) bytes.
  // A (Q, x4): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
  const int qa_row = 16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8, qa_sel = lane >> 4;
  // B of S (K rows = positions; x4 = two n8 tiles): (pos 0-7, k 0-7), (pos 0-7, k 8-15),
  // (pos 8-15, k 0-7), (pos 8-15, k 8-15); n8-tile pair np adds 16·np rows (phase unchanged).
  const int kb_row = (lane >> 4) * 8 + (lane & 7), kb_sel = (lane >> 3) & 1;
  // B of P·V (V rows = positions = k; .trans; x4 = two n8 tiles of dims): (pos 0-7, dims 0-7),
  // (pos 8-15, dims 0-7), (pos 0-7, dims 8-15), (pos 8-15, dims 8-15); k16 step ks adds 16·ks rows.
  const int vb_row = ((lane >> 3) & 1) * 8 + (lane & 7), vb_sel = lane >> 4;
  uint32_t q_off[4], k_off[4], v_off[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    q_off[j] = a_q + uint32_t(qa_row) * kRowBytes + (uint32_t((2 * j + qa_sel) ^ (qa_row & 7)) << 4);
    k_off[j] = uint32_t(kb_row) * kRowBytes + (uint32_t((2 * j + kb_sel) ^ (kb_row & 7)) << 4);
    v_off[j] = uint32_t(vb_row) * kRowBytes + (uint32_t((2 * j + vb_sel) ^ (vb_row & 7)) << 4);
  }

  float o[kON][4];
  zero_fragments(o);
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  for (int t = 0; t < n_tiles; ++t) {
    const int t0 = t * kBc;
    cp_async_wait<0>();  // this thread's copies of tile t have landed
    __syncthreads();     // everyone's (and Q, on the first tile); every warp is done with tile t − 1
    if (t + 1 < n_tiles) load_tile(t + 1);  // into tile t − 1's stage
    cp_async_commit();

    if (t0 > warp_pos) continue;  // warp-uniform: no row of the warp sees this tile
    const uint32_t a_k = a_kv + uint32_t(t & 1) * 2u * kTileBytes, a_v = a_k + kTileBytes;

    // S = Q · Kᵀ: per k16 step, hi then lo into each accumulator (the 4-warp kernel's chains).
    float s[kSN][4];
    zero_fragments(s);
    qk_tile<kHd>(
        s,
        [&](int ks, uint32_t(&ah)[4], uint32_t(&al)[4]) {
          const uint32_t qa = q_off[ks & 3] + 128u * uint32_t(ks >> 2);
          ldmatrix_x4(qa, ah);
          ldmatrix_x4(qa + kPlaneBytes, al);
        },
        [&](int ks, int np) {
          return a_k + k_off[ks & 3] + 128u * uint32_t(ks >> 2) + uint32_t(16 * np) * kRowBytes;
        });

    // Online softmax; the causal selects only where some row of the warp stops inside the tile
    // (lim[i] = row i's position − t0 − 2·tq: position 8n + c of the thread is visible iff <= lim).
    float corr[2];
    const int lim[2] = {rpos[0] - t0 - 2 * tq, rpos[1] - t0 - 2 * tq};
    if (warp_min >= t0 + kBc - 1)
      tile_softmax(s, m_run, l_run, corr, [](int, int, int) { return true; });
    else
      tile_softmax(s, m_run, l_run, corr, [&](int i, int n, int c) { return 8 * n + c <= lim[i]; });
    rescale_o(o, corr);
    // O += P · V: k16 step ks covers positions t0 + 16ks .. +15.
    pv_tile(o, s, [&](int ks, int dp) {
      return a_v + v_off[dp & 3] + 128u * uint32_t(dp >> 2) + uint32_t(16 * ks) * kRowBytes;
    });
  }
  cp_async_wait<0>();  // only empty groups can be left; drain them before the CTA exits

  // ---- out = O / l · sigmoid(gate) ----
  store_gated_output<kHd>(o, l_run, rpos, tq, a, [&](int i) { return row_oh(16 * warp + g + 8 * i) * kHd; });
}

// ---- host side --------------------------------------------------------------------------------

int current_device() {
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// The device's per-block shared-memory opt-in limit, queried once per device (< 64 devices).
int max_optin_smem(int dev) {
  static std::atomic<int> cached[64] = {};
  if (dev >= 0 && dev < 64) {
    const int v = cached[dev].load();
    if (v > 0) return v;
  }
  int v = 0;
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (dev >= 0 && dev < 64) cached[dev].store(v);
  return v;
}

// Opts the kernel in to > 48 KB of dynamic shared memory, once per device.
template <int kHd>
void opt_in() {
  constexpr size_t smem = smem_bytes(kHd);
  if constexpr (smem > 48 * 1024) opt_in_dynamic_smem<attention_prefill_wide_kernel<kHd>>(smem);
}

template <int kHd>
void launch(const WideArgs& args, unsigned grid, cudaStream_t stream) {
  opt_in<kHd>();
  attention_prefill_wide_kernel<kHd><<<grid, kThreads, smem_bytes(kHd), stream>>>(args);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_prefill_wide_fits(int head_dim) {
  return smem_bytes(head_dim) <= size_t(max_optin_smem(current_device()));
}

void attention_prefill_wide_prepare() {
  if (attention_prefill_wide_fits(64)) opt_in<64>();
  if (attention_prefill_wide_fits(128)) opt_in<128>();
  if (attention_prefill_wide_fits(256)) opt_in<256>();
}

void attention_prefill_wide(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                            const KvCacheView& cache, float scale, int seq_begin, int seq_end, int row_begin,
                            int row_count, float* out, cudaStream_t stream) {
  WideArgs a{};
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
  a.row_end = row_begin + row_count;
  const int bs = cache.block_size;
  a.bs_shift = -1;
  if (bs > 0 && (bs & (bs - 1)) == 0)
    for (a.bs_shift = 0; (1 << a.bs_shift) < bs; ++a.bs_shift) {
    }
  a.scale_log2 = scale * kLog2e;
  // Query tiles: ceil(n_s / T) per sequence, n_s its rows in the call's range (Σ n_s <= row_count):
  // at most row_count / T + the number of sequences.
  const long long tiles = (long long)row_count / a.tile_tokens + (seq_end - seq_begin);
  const long long slots = tiles * a.nkv * a.head_blocks;
  if (slots > 0x7fffffffLL) throw Error("paged_attention_prefill: too many tokens for the launch grid");
  switch (shape.head_dim) {
    case 64: launch<64>(a, unsigned(slots), stream); break;
    case 128: launch<128>(a, unsigned(slots), stream); break;
    default: launch<256>(a, unsigned(slots), stream); break;
  }
}

}  // namespace moeserve::cuda::detail
