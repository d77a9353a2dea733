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
// Parallelisation. Work item = (token t, chunk c of its range, kv head, block of 16 q heads),
// numbered u·Y + y with u = Σ_{t' < t} nc(t') + c and y = kv head · head_blocks + head block; the
// numbering is derived on the device from the tokens' positions (the host does not know them when
// a step is a CUDA-graph replay). A grid of at most the resident CTAs walks the items. CTA = 4
// warps; its MMA rows are the 16 q heads (rows past the group are zero padding, never stored). A
// chunk is walked in rounds of 64 positions (two 32-position tiles): the round's K and V rows are
// copied once into shared memory (cp.async; positions past the chunk's last visible one
// zero-filled), warp w computes the scores of positions [16w, 16w + 16) of the round (two n8 tiles)
// into a shared S buffer, then every warp runs the online softmax of each tile over the whole S
// (the same operations in every warp, so the same values) and P·V for its quarter of the dims. The
// next round's and the next item's K / V rows are prefetched into L2 while a round computes.
// Shared memory (bf16 planes row-swizzled as attn_mma::swz): Q hi / lo [16][hd] each, K and V
// [64][hd] each, S [16][64 + 4] f32: 84 KB at hd 256 (two CTAs per SM on the H200), 42 at hd 128.
//
// Arithmetic (batch invariant: a function of the token's position p, its q / gate rows and the cache):
//   q' = q ⊗ (scale·log2 e), split hi + lo (bf16);
//   chunks as ops_attention.cu (attention_chunks.cuh): C = chunk_size(p + 1), chunk c = [cC, cC + C);
//   inside a chunk, 32-position tiles at fixed offsets from its start, in order, from an empty state:
//   per tile exactly the prefill kernels' tile step (ops_attention_mma_common.cuh: S by the hi / lo
//   MMA chain over the dims in ascending k16 steps, tmax, m', corr, P = ex2.approx(S − m'), l = fma(l,
//   corr, rowsum), O ⊗ corr, O += P·V by hi / lo MMAs), positions > p excluded by selects;
//   a query with one chunk: out = (O ÷ l) ⊗ sigmoid(gate) here; else the chunk partial (m, l, O) goes
//   to the workspace and the merge kernel folds the partials in chunk order (fold_partial), then the
//   same gated output. An MMA computes each C element from its own A row, B column and old value, so
//   which warp, CTA, launch or step computes a row changes no bit: a token gets the same bits alone,
//   among 63 others, in a verify batch or in a step of more than 64 tokens (launched in groups).
//   The bits differ from the CUDA-core kernels' (other products and tiles), so the model runs every
//   generated token of a configuration through one family (CudaModelOptions::tensor_core_attention).
//
// Roofline (decode, batch 64, context 512, the 122B shapes: hd 256, 2 kv heads x 16 q heads): K and V
// (p+1)·hd·2·2 B per (token, kv head) = 33.6 MB per layer, ~8 us at 4.3 TB/s; MMAs 2 (hi, lo) x 4·hd
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

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kHeads = 16;                 // MMA rows: q heads of one kv head per item
constexpr int kRound = 2 * kBc;            // positions per round (two tiles)
constexpr int kSStride = kRound + 4;       // S row stride in floats (+4: the rows' float2 stores spread over banks)
constexpr int kMaxTok = kDecodeTcMaxTokens;
static_assert(attn_chunks::kChunk0 % kRound == 0, "a chunk is whole rounds");
static_assert(kRound == 16 * kWarps, "warp w scores positions [16w, 16w + 16) of a round");

template <int kHd>
constexpr size_t smem_bytes() {
  return size_t(2 * kHeads + 2 * kRound) * kHd * 2 + size_t(kHeads) * kSStride * 4;
}
static_assert(smem_bytes<256>() <= 99 * 1024, "DGX Spark: <= 99 KB of shared memory per block");

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

// Element offset of position p's row of kv head kvh in the cache.
__device__ __forceinline__ size_t row_offset(const KvCacheView& c, const int32_t* table, int kvh, int p, int hd) {
  return ((size_t(table[p / c.block_size]) * c.num_kv_heads + kvh) * c.block_size + p % c.block_size) * size_t(hd);
}

// Prefetches the K and V rows of positions [p0, p1] of kv head kvh into L2 (128-byte lines).
template <int kHd>
__device__ __forceinline__ void prefetch_rows(const KvCacheView& c, const int32_t* table, int kvh, int p0, int p1,
                                              int tid) {
  constexpr int kLines = kHd * 2 / 128 > 0 ? kHd * 2 / 128 : 1;  // lines per row
  const int n = (p1 - p0 + 1) * kLines;
  for (int i = tid; i < 2 * n; i += kThreads) {
    const int which = i >= n, j = i - which * n;
    const int p = p0 + j / kLines, line = j % kLines;
    const bf16* base = which ? c.v : c.k;
    const bf16* ptr = base + row_offset(c, table, kvh, p, kHd) + line * 64;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
  }
}

template <int kHd>
__global__ void __launch_bounds__(kThreads, 2) attention_decode_tc_kernel(DecodeTcArgs a) {
  static_assert(kHd % 64 == 0 && kHd <= 256, "head_dim: a multiple of 64 up to 256");
  constexpr int kChunks = kHd / 8;        // 16-byte chunks per row
  constexpr int kONw = kHd / 8 / kWarps;  // n8 dim tiles of O per warp (even: pv_tile's pairs)
  static_assert(kONw % 2 == 0, "pv_tile takes dim tiles in pairs");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* const sq_hi = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sq_lo = sq_hi + kHeads * kHd;
  bf16* const sk = sq_lo + kHeads * kHd;
  bf16* const sv = sk + kRound * kHd;
  float* const ss = reinterpret_cast<float*>(sv + kRound * kHd);
  const uint32_t a_qhi = uint32_t(__cvta_generic_to_shared(sq_hi));
  const uint32_t a_qlo = uint32_t(__cvta_generic_to_shared(sq_lo));
  const uint32_t a_k = uint32_t(__cvta_generic_to_shared(sk));
  const uint32_t a_v = uint32_t(__cvta_generic_to_shared(sv));
  __shared__ int s_first[kMaxTok + 1];  // first u of each token; s_first[M] = Σ nc

  pdl_launch_dependents();  // the merge kernel (PDL) waits for this grid to complete
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int M = a.meta.num_tokens;
  const KvCacheView& cache = a.cache;

  // ---- the item numbering, from the host-written metadata (before the PDL wait) ----
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
  const int Y = a.nkv * a.head_blocks;
  const int items = s_first[kMaxTok] * Y;  // tokens >= M add no chunks

  // The first item's K / V rows into L2 while the previous kernel (attention_prepare, which writes
  // the new rows) finishes: L2 is the point of coherence, so a prefetched line is never stale.
  if (int(blockIdx.x) < items) {
    const Item w = map_item(a, s_first, M, Y, int(blockIdx.x));
    prefetch_rows<kHd>(cache, w.table, w.kvh, w.c0, min(w.c_last, w.c0 + kRound - 1), tid);
  }
  pdl_wait();  // q, gate and the new K / V rows are written by attention_prepare

  // Per-lane ldmatrix coordinates (the prefill kernels' fragment layouts, attn_mma).
  const int qa_row = (lane & 7) + ((lane >> 3) & 1) * 8, qa_chunk = lane >> 4;        // Q (A, x4)
  const int kb_row = 16 * warp + (lane >> 4) * 8 + (lane & 7), kb_chunk = (lane >> 3) & 1;  // K (B, x4)
  const int vb_row = ((lane >> 3) & 1) * 8 + (lane & 7), vb_chunk = lane >> 4;        // V (B, x4.trans)

  for (int item = int(blockIdx.x); item < items; item += int(gridDim.x)) {
    const Item w = map_item(a, s_first, M, Y, item);
    const int head0 = w.kvh * a.group + w.hb * kHeads;      // the item's first q head
    const int heads = min(kHeads, a.group - w.hb * kHeads);  // valid rows
    {  // the next item's first round into L2
      const int nx = item + int(gridDim.x);
      if (nx < items) {
        const Item n = map_item(a, s_first, M, Y, nx);
        prefetch_rows<kHd>(cache, n.table, n.kvh, n.c0, min(n.c_last, n.c0 + kRound - 1), tid);
      }
    }
    __syncthreads();  // the previous item's readers of the Q planes, K, V and S are done

    // ---- Q: f32 -> ·scale·log2e -> hi / lo planes ----
    for (int c = tid; c < kHeads * (kHd / 4); c += kThreads) {
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

    float o[kONw][4];
    zero_fragments(o);
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    for (int r0 = w.c0; r0 <= w.c_last; r0 += kRound) {
      const int nt = min(2, (w.c_last - r0) / kBc + 1);  // tiles of the round with a visible position
      if (r0 > w.c0) __syncthreads();                     // the previous round's readers are done
      // K, then V, of positions [r0, r0 + 64): rows past c_last zero-filled (never read from the cache).
      for (int which = 0; which < 2; ++which) {
        const bf16* src = which ? cache.v : cache.k;
        const uint32_t dst0 = which ? a_v : a_k;
        for (int c = tid; c < kRound * kChunks; c += kThreads) {
          const int j = c / kChunks, ch = c % kChunks, p = r0 + j;
          const uint32_t dst = dst0 + uint32_t(swz<kHd>(j, ch)) * 2u;
          if (p <= w.c_last) cp_async16(dst, src + row_offset(cache, w.table, w.kvh, p, kHd) + size_t(ch) * 8, 16);
          else cp_async16(dst, src, 0);
        }
        cp_async_commit();
      }
      if (r0 + kRound <= w.c_last)  // the next round into L2
        prefetch_rows<kHd>(cache, w.table, w.kvh, r0 + kRound, min(w.c_last, r0 + 2 * kRound - 1), tid);
      cp_async_wait<1>();  // this thread's K copies have landed
      __syncthreads();     // everyone's, and the Q planes

      // ---- S of positions [16·warp, 16·warp + 16) of the round: the qk_tile chain per n8 tile ----
      if (16 * warp < nt * kBc) {  // warp-uniform
        float s2[2][4];
        zero_fragments(s2);
#pragma unroll 4
        for (int ks = 0; ks < kHd / 16; ++ks) {
          uint32_t ah[4], al[4], r4[4];
          const uint32_t qoff = uint32_t(swz<kHd>(qa_row, 2 * ks + qa_chunk)) * 2u;
          ldmatrix_x4(a_qhi + qoff, ah);
          ldmatrix_x4(a_qlo + qoff, al);
          ldmatrix_x4(a_k + uint32_t(swz<kHd>(kb_row, 2 * ks + kb_chunk)) * 2u, r4);
          mma_bf16(s2[0], ah, r4[0], r4[1]);
          mma_bf16(s2[1], ah, r4[2], r4[3]);
          mma_bf16(s2[0], al, r4[0], r4[1]);
          mma_bf16(s2[1], al, r4[2], r4[3]);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int col = 16 * warp + 8 * n + 2 * tq;
          *reinterpret_cast<float2*>(ss + g * kSStride + col) = make_float2(s2[n][0], s2[n][1]);
          *reinterpret_cast<float2*>(ss + (g + 8) * kSStride + col) = make_float2(s2[n][2], s2[n][3]);
        }
      }
      cp_async_wait<0>();  // this thread's V copies have landed
      __syncthreads();     // S complete, everyone's V

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
    }

    // ---- the chunk's result: the output (one chunk) or the partial (several) ----
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = g + 8 * i;
      if (r >= heads) continue;
      const size_t oh = size_t(w.t) * a.nq + head0 + r;  // token·nq + q head
      if (w.nc == 1) {
        const float L = l_run[i];
#pragma unroll
        for (int n = 0; n < kONw; ++n) {
          const int d = 8 * (warp * kONw + n) + 2 * tq;
          const float2 gv = __ldcg(reinterpret_cast<const float2*>(a.gate + oh * kHd + d));
          const float s0 = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp2_approx(__fmul_rn(-gv.x, kLog2e))));
          const float s1 = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp2_approx(__fmul_rn(-gv.y, kLog2e))));
          *reinterpret_cast<float2*>(a.out + oh * kHd + d) =
              make_float2(__fmul_rn(__fdiv_rn(o[n][2 * i], L), s0), __fmul_rn(__fdiv_rn(o[n][2 * i + 1], L), s1));
        }
      } else {
        const size_t slot = oh * a.chunk_stride + w.chunk;
        if (warp == 0 && tq == 0) *reinterpret_cast<float2*>(a.ws_ml + slot * 2) = make_float2(m_run[i], l_run[i]);
#pragma unroll
        for (int n = 0; n < kONw; ++n) {
          const int d = 8 * (warp * kONw + n) + 2 * tq;
          *reinterpret_cast<float2*>(a.ws_acc + slot * kHd + d) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
        }
      }
    }
  }
  cp_async_wait<0>();
}

int g_ctas_per_sm[3] = {0, 0, 0};  // per head_dim 64 / 128 / 256, for the current device (set up once)

template <int kHd>
int setup() {
  constexpr size_t smem = smem_bytes<kHd>();
  if constexpr (smem > 48 * 1024) opt_in_dynamic_smem<attention_decode_tc_kernel<kHd>>(smem, true);
  int n = 0;
  MOESERVE_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_tc_kernel<kHd>, kThreads, smem));
  return std::max(1, n);
}

template <int kHd>
void launch(const DecodeTcArgs& a, size_t max_items, int slot, cudaStream_t stream) {
  if (g_ctas_per_sm[slot] == 0) g_ctas_per_sm[slot] = setup<kHd>();
  const size_t cap = size_t(current_device_sm_count()) * size_t(g_ctas_per_sm[slot]);
  const unsigned grid = unsigned(std::max<size_t>(1, std::min(max_items, cap)));
  launch_pdl(true, attention_decode_tc_kernel<kHd>, dim3(grid), dim3(kThreads), smem_bytes<kHd>(), stream, a);
}

}  // namespace

bool attention_decode_tc_supported(const AttentionShape& s) {
  return (s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256) && s.num_kv_heads > 0 && s.num_q_heads > 0 &&
         s.num_q_heads % s.num_kv_heads == 0;
}

void attention_decode_tc_prepare() {
  if (g_ctas_per_sm[0] == 0) g_ctas_per_sm[0] = setup<64>();
  if (g_ctas_per_sm[1] == 0) g_ctas_per_sm[1] = setup<128>();
  if (g_ctas_per_sm[2] == 0) g_ctas_per_sm[2] = setup<256>();
}

void attention_decode_tc(const DecodeTcArgs& a, int head_dim, size_t max_items, cudaStream_t stream) {
  if (a.meta.num_tokens <= 0) return;
  if (a.meta.num_tokens > kMaxTok)
    throw Error("attention (tensor-core decode): at most " + std::to_string(kMaxTok) + " tokens per launch, got " +
                std::to_string(a.meta.num_tokens));
  switch (head_dim) {
    case 64: launch<64>(a, max_items, 0, stream); break;
    case 128: launch<128>(a, max_items, 1, stream); break;
    case 256: launch<256>(a, max_items, 2, stream); break;
    default: throw Error("attention (tensor-core decode): head_dim must be 64, 128 or 256, got " + std::to_string(head_dim));
  }
}

}  // namespace moeserve::cuda::detail
