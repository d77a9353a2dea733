// moe_routed_experts_mma (ops_moe.h): the routed-expert block for prompt-class rows with the
// expert GEMMs on bf16 tensor cores (mma.sync.m16n8k16 + ldmatrix; sm_80+, no wgmma / TMA, so the
// same code runs on the H200 and the DGX Spark; 40 KB of static shared memory per CTA).
//
// Steps (one stream, no host synchronisation):
//   1. route_and_group (ops_moe.cu, the same routing as moe_routed_experts): ids / weights per slot
//      (slot = token·k + rank), then the slots grouped by expert into tiles of up to kBM = 64
//      slots (TileList; grouping is one CTA that loops over all M·k slots, any M).
//   2. gate_up kernel: act[p, I] = silu(x·Wgᵀ) ⊙ (x·Wuᵀ), p = the slot's position in the tile order.
//   3. down kernel:    y[slot, H] = act[p]·Wdᵀ.
//   4. combine_routed (ops_moe.cu): residual[m] += Σ_r w·y[m·k + r] (+ sigmoid(gate)·shared).
//
// Data layout. x f32 [M, H] (16-byte aligned); act f32 [M·k, I] by order position (so the down
// kernel's A rows of a tile are contiguous); y f32 [M·k, H] by slot (the combine's layout). Experts:
// ops_moe.h (GPTQ qweight [E][K/8][N], scales f16 [E][K/g][N], qzeros [E][K/g][N/8]; FP8 e4m3
// [E][N][K] with f32 scales [E][ceil(N/128)][ceil(K/128)]; bf16 [E][N][K]).
//
// Parallelisation. Grid (ceil(N / BN), max_tiles): CTA (nb, t) computes tile t's <= 64 slots x
// the BN columns nb·BN.. of its expert (gate_up: BN = 64 columns of gate AND of up, so the SwiGLU
// epilogue is local; down: BN = 128); CTAs with t >= *num_tiles exit at once. 8 warps as 2 (rows)
// x 4 (columns), warp tile 32 rows x BN/4 columns (per matrix). The CTA walks K in tiles of
// kBK = 32: each thread loads its share of the next k tile into registers (A rows gathered by slot
// as float4, weights as 4- or 16-byte words, GPTQ scales / zero points) while the warps compute
// the current one, then converts and stores it into the other of two shared-memory buffers
// (A split into bf16 hi and lo planes, weights converted to bf16 exactly); one __syncthreads per k
// tile. (Register staging instead of cp.async: every weight format needs a conversion before
// ldmatrix.) m16 row fragments at or past the tile's slot count are skipped (warp-uniform), so a
// tile of 16 / 32 slots issues 1/4 / 1/2 of the MMAs of a full one.
//
// Arithmetic of one output (slot, n), fixed by K and the format only (never by the tile, the
// slot's row in it, M or the other slots: an MMA computes each C element from its own A row,
// B column and old value), for each k16 step in ascending k: C = mma(hi, B, C), C = mma(lo, B, C);
//   bf16: y = C;  GPTQ: B = q − zero (exact), C restarts at 0 for each group of g k's and after
//   the group acc = fma(C, scale[g][n], acc);  FP8: B = e4m3 (exact), the same per 128-k block
//   with the block scale. Epilogues use explicit __fmaf_rn / __fmul_rn / __fdiv_rn / __fadd_rn.
// So a token's result is bit-identical for any M and any other tokens (batch invariance; chunked
// prefill equals one pass), but differs from moe_routed_experts' CUDA-core sums.
//
// Roofline. Weights: every expert with at least one slot is read once per tile of its slots (a
// second tile only past 64 slots); at 1K tokens x top-8 over 256 experts nearly every expert is
// active: 122B-A10B INT4 g128 experts, 3·3072·1024/2 bytes + scales each, ~1.25 GB per layer,
// ~0.3 ms at 4.3 TB/s. MMA work: 2·(3·H·I)·slots useful FLOP (155 GFLOP per layer at 1K tokens),
// executed twice (hi and lo) plus the zero rows of partial m16 fragments. A rows are re-read from
// L2 by every column block: x by I/64 CTAs per tile, act by H/128 CTAs per tile.
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda {
namespace {

using namespace moe_detail;
using namespace mma_frag;

enum class BFmt { Bf16, Fp8, Gptq };

constexpr int kBM = 64;      // slots per tile (the grouping's tile size)
constexpr int kBK = 32;      // k per shared-memory stage
constexpr int kS = kBK + 8;  // bf16 per shared row: 80 bytes = 5 (odd) 16-byte units, conflict-free ldmatrix
constexpr int kWM = 2, kWN = 4, kThreads = kWM * kWN * 32;
constexpr int kWarpM = kBM / kWM;  // 32 rows per warp
constexpr int kMI = kWarpM / 16;   // m16 fragments per warp

// kMats = 2: gate and up (B rows [0, BN) gate, [BN, 2·BN) up); 1: down.
template <int kMats, int BN>
struct Cfg {
  static constexpr int kWarpN = BN / kWN;  // columns per warp, per matrix
  static constexpr int NI = kWarpN / 8;    // n8 fragments per warp, per matrix
  static constexpr int kBRows = kMats * BN;
  static constexpr int kBufElems = (2 * kBM + kBRows) * kS;  // A hi, A lo, B
  static constexpr int kALoads = kBM * (kBK / 4) / kThreads;  // float4 per thread per k tile
  static_assert(NI % 2 == 0, "B fragments are loaded in pairs of n8 tiles");
  static_assert(128 % BN == 0, "FP8: one scale row per CTA");
  static_assert(kBM * (kBK / 4) % kThreads == 0, "A loader share");
  static_assert(kBRows * (kBK / 8) % kThreads == 0 && kBRows * (kBK / 16) % kThreads == 0, "B loader share");
  static_assert(kBRows <= kThreads, "one GPTQ scale per thread");
  static_assert(2 * kBufElems * 2 + 2 * kBRows * 4 <= 48 * 1024, "static shared memory");
};

using GateUpCfg = Cfg<2, 64>;
using DownCfg = Cfg<1, 128>;

// Weights of one k tile per thread, in registers between the load and the store.
template <BFmt F>
struct BStage {
  // Bf16: 8-bf16 chunks; Fp8: 16-byte chunks; Gptq: words (k .. k+7 of one n) and their zero points.
  static constexpr int kPerRow = F == BFmt::Fp8 ? kBK / 16 : kBK / 8;
};

__device__ __forceinline__ float silu_mul_rn(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, __expf(-g))), u);
}

// One CTA: tile blockIdx.y (slots order[start .. start + count) of expert e) x columns
// blockIdx.x·BN .. of w0 (and w1). a: gate_up x [M, K] (row = slot / top_k); down act [M·k, K]
// (row = order position). out: gate_up act [pos, N]; down y [slot, N].
template <int kMats, int BN, BFmt F>
__global__ void __launch_bounds__(kThreads)
    moe_mma_kernel(const float* __restrict__ a, int top_k, TileList tiles, ExpertView w0, ExpertView w1,
                   float* __restrict__ out) {
  using C = Cfg<kMats, BN>;
  constexpr int NI = C::NI, kBRows = C::kBRows, kALoads = C::kALoads;
  constexpr int kPerRow = BStage<F>::kPerRow;
  constexpr int kBLoads = kBRows * kPerRow / kThreads;

  const int t = int(blockIdx.y);
  if (t >= *tiles.num_tiles) return;  // uniform over the CTA, before any barrier
  const int e = tiles.expert[t], start = tiles.start[t], count = tiles.count[t];
  const int N = w0.N, K = w0.K;
  const int n0 = int(blockIdx.x) * BN;

  __shared__ __align__(16) bf16 smem[2 * C::kBufElems];
  __shared__ float gscale[2][kBRows];  // GPTQ: the k tile's group scale of each B row
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem));

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / kWN, warp_n = warp % kWN;

  // ---- this thread's A rows (fixed over k): chunk c = tid + i·kThreads is row c / 8, k 4·(c % 8) ----
  const float* arow[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int r = (tid + i * kThreads) / (kBK / 4);
    arow[i] = nullptr;
    if (r < count) {
      const int p = start + r;
      arow[i] = kMats == 2 ? a + size_t(tiles.order[p] / top_k) * K : a + size_t(p) * K;
    }
  }

  // ---- this thread's B chunks: GPTQ chunk c is (k-word c / kBRows, B row c % kBRows) so a warp
  // reads 32 consecutive n of one packed row; Bf16 / FP8 chunk c is (B row c / kPerRow, part c % kPerRow) ----
  auto b_row_of = [&](int c) { return F == BFmt::Gptq ? c % kBRows : c / kPerRow; };
  auto b_part_of = [&](int c) { return F == BFmt::Gptq ? c / kBRows : c % kPerRow; };
  const int gsize = w0.group;                     // GPTQ group (32 / 64 / 128)
  const int groups = F == BFmt::Gptq ? K / gsize : 1;

  float4 ar[kALoads];
  uint4 br[kBLoads];
  float bscale = 0.f;  // GPTQ: the scale of B row tid (tid < kBRows)
  auto load_tile = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int k = k0 + ((tid + i * kThreads) % (kBK / 4)) * 4;
      ar[i] = arow[i] && k < K ? __ldg(reinterpret_cast<const float4*>(arow[i] + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int c = tid + i * kThreads, row = b_row_of(c), part = b_part_of(c);
      const bool m0 = row < BN;  // B row of w0 (gate / down) or of w1 (up)
      const int n = n0 + (m0 ? row : row - BN);
      br[i] = make_uint4(0u, 0u, 0u, 0u);
      if constexpr (F == BFmt::Gptq) {  // K % 32 == 0: the tile is inside K
        if (n < N) {
          const int32_t* qw = m0 ? w0.qweight : w1.qweight;
          br[i].x = uint32_t(__ldg(qw + (size_t(e) * (K / 8) + k0 / 8 + part) * N + n));
          const int grp = k0 / gsize;  // g >= 32 = kBK: one group per k tile
          if (m0 ? w0.sym : w1.sym) {
            br[i].y = 8u;
          } else {
            const int32_t* qz = m0 ? w0.qzeros : w1.qzeros;
            br[i].y = ((uint32_t(__ldg(qz + (size_t(e) * groups + grp) * (N / 8) + n / 8)) >> (4 * (n % 8))) & 0xFu) + 1u;
          }
        }
      } else if constexpr (F == BFmt::Fp8) {
        const int k = k0 + part * 16;
        const uint8_t* wp = m0 ? w0.fp8 : w1.fp8;
        if (n < N && k < K) br[i] = __ldg(reinterpret_cast<const uint4*>(wp + (size_t(e) * N + n) * K + k));
      } else {
        const int k = k0 + part * 8;
        const bf16* wp = m0 ? w0.dense : w1.dense;
        if (n < N && k < K) br[i] = __ldg(reinterpret_cast<const uint4*>(wp + (size_t(e) * N + n) * K + k));
      }
    }
    if constexpr (F == BFmt::Gptq) {
      if (tid < kBRows) {
        const bool m0 = tid < BN;
        const int n = n0 + (m0 ? tid : tid - BN);
        const __half* sp = m0 ? w0.scales : w1.scales;
        bscale = n < N ? __half2float(__ldg(sp + (size_t(e) * groups + k0 / gsize) * N + n)) : 0.f;
      }
    }
  };
  auto store_tile = [&](int buf) {
    bf16* ahi = smem + buf * C::kBufElems;
    bf16* alo = ahi + kBM * kS;
    bf16* bs = alo + kBM * kS;
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int c = tid + i * kThreads, r = c / (kBK / 4), col = (c % (kBK / 4)) * 4;
      uint2 hi, lo;
      split2(ar[i].x, ar[i].y, hi.x, lo.x);
      split2(ar[i].z, ar[i].w, hi.y, lo.y);
      *reinterpret_cast<uint2*>(ahi + r * kS + col) = hi;
      *reinterpret_cast<uint2*>(alo + r * kS + col) = lo;
    }
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int c = tid + i * kThreads, row = b_row_of(c), part = b_part_of(c);
      if constexpr (F == BFmt::Gptq) {
        *reinterpret_cast<uint4*>(bs + row * kS + part * 8) = gptq_word_to_bf16x8(br[i].x, int(br[i].y));
      } else if constexpr (F == BFmt::Fp8) {
        uint4 lo, hi;
        fp8x16_to_bf16(br[i], lo, hi);
        *reinterpret_cast<uint4*>(bs + row * kS + part * 16) = lo;
        *reinterpret_cast<uint4*>(bs + row * kS + part * 16 + 8) = hi;
      } else {
        *reinterpret_cast<uint4*>(bs + row * kS + part * 8) = br[i];
      }
    }
    if constexpr (F == BFmt::Gptq) {
      if (tid < kBRows) gscale[buf][tid] = bscale;
    }
  };

  // ---- ldmatrix lane addresses (bytes from a plane's start at k step 0), as in ops_mma_gemm.cu ----
  uint32_t a_off[kMI];
  bool active[kMI];  // the m16 fragment holds at least one of the tile's slots (warp-uniform)
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) {
    a_off[mi] = uint32_t(((warp_m * kWarpM + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kS + (lane >> 4) * 8) * 2);
    active[mi] = warp_m * kWarpM + mi * 16 < count;
  }
  const bool any_active = active[0];  // fragments are ordered: mi = 0 is active if any is
  uint32_t b_off[kMats][NI / 2];
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int j = 0; j < NI / 2; ++j)
      b_off[mat][j] = uint32_t(
          ((mat * BN + warp_n * C::kWarpN + j * 16 + (lane & 7) + (lane >> 4) * 8) * kS + ((lane >> 3) & 1) * 8) * 2);

  float c[kMats][kMI][NI][4];    // the running MMA accumulator (GPTQ / FP8: of the current group / block)
  float acc[kMats][kMI][NI][4];  // GPTQ / FP8: the sum of scaled groups / blocks
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int q = 0; q < 4; ++q) c[mat][mi][ni][q] = acc[mat][mi][ni][q] = 0.f;

  // acc = fma(C, s, acc); C = 0. s(mat, ni, j): the scale of column warp_n·kWarpN + ni·8 + 2·(lane % 4) + j.
  auto flush = [&](auto&& scale_of) {
#pragma unroll
    for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float s = scale_of(mat, ni, j);
#pragma unroll
          for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              acc[mat][mi][ni][2 * h + j] = __fmaf_rn(c[mat][mi][ni][2 * h + j], s, acc[mat][mi][ni][2 * h + j]);
              c[mat][mi][ni][2 * h + j] = 0.f;
            }
        }
  };

  const int nb128 = (N + 127) / 128, kb128 = (K + 127) / 128;  // FP8 scale grid
  auto compute_tile = [&](int buf, int k0) {
    const uint32_t ahi = sbase + uint32_t(buf * C::kBufElems * 2);
    const uint32_t alo = ahi + uint32_t(kBM * kS * 2), bs = alo + uint32_t(kBM * kS * 2);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      const int k = k0 + ks * 16;
      if (k >= K) break;  // uniform over the CTA
      uint32_t ah[kMI][4], al[kMI][4], b[kMats][NI][2];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
        if (active[mi]) {
          ldmatrix_x4(ahi + a_off[mi] + ks * 32, ah[mi]);
          ldmatrix_x4(alo + a_off[mi] + ks * 32, al[mi]);
        }
#pragma unroll
      for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
        for (int j = 0; j < NI / 2; ++j) {
          uint32_t r[4];
          ldmatrix_x4(bs + b_off[mat][j] + ks * 32, r);
          b[mat][2 * j][0] = r[0], b[mat][2 * j][1] = r[1], b[mat][2 * j + 1][0] = r[2], b[mat][2 * j + 1][1] = r[3];
        }
      // Per output: this k step's hi MMA, then its lo MMA (all hi first for ILP).
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
        if (active[mi]) {
#pragma unroll
          for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mat][mi][ni], ah[mi], b[mat][ni]);
        }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
        if (active[mi]) {
#pragma unroll
          for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mat][mi][ni], al[mi], b[mat][ni]);
        }
      if constexpr (F == BFmt::Gptq) {
        if ((k + 16) % gsize == 0)
          flush([&](int mat, int ni, int j) {
            return gscale[buf][mat * BN + warp_n * C::kWarpN + ni * 8 + (lane & 3) * 2 + j];
          });
      } else if constexpr (F == BFmt::Fp8) {
        if ((k + 16) % 128 == 0 || k + 16 == K) {
          const float s0 = __ldg(w0.scale + (size_t(e) * nb128 + n0 / 128) * kb128 + k / 128);
          const float s1 = kMats == 2 ? __ldg(w1.scale + (size_t(e) * nb128 + n0 / 128) * kb128 + k / 128) : 0.f;
          flush([&](int mat, int, int) { return mat == 0 ? s0 : s1; });
        }
      }
    }
  };

  // ---- main loop: compute buffer kt & 1 while tile kt + 1 is in flight, then store it ----
  const int kt_count = (K + kBK - 1) / kBK;
  load_tile(0);
  store_tile(0);
  __syncthreads();
  for (int kt = 0; kt < kt_count; ++kt) {
    const bool more = kt + 1 < kt_count;  // uniform
    if (more) load_tile((kt + 1) * kBK);
    if (any_active) compute_tile(kt & 1, kt * kBK);  // warp-uniform
    if (more) store_tile((kt + 1) & 1);  // the buffer every warp finished reading before the last barrier
    __syncthreads();
  }

  // ---- epilogue: C fragment element q of (mi, ni) is row lane / 4 (+8 for q >= 2), column 2·(lane % 4) + (q & 1) ----
  auto value = [&](int mat, int mi, int ni, int q) { return F == BFmt::Bf16 ? c[mat][mi][ni][q] : acc[mat][mi][ni][q]; };
  const bool vec2 = (N & 1) == 0;  // out rows start 8-byte aligned (workspace buffers are 256-byte aligned)
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) {
    if (!active[mi]) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp_m * kWarpM + mi * 16 + (lane >> 2) + h * 8;
      if (r >= count) continue;
      float* orow = out + size_t(kMats == 2 ? start + r : tiles.order[start + r]) * N;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int n = n0 + warp_n * C::kWarpN + ni * 8 + (lane & 3) * 2;
        if (n >= N) continue;
        float v0, v1;
        if constexpr (kMats == 2) {
          v0 = silu_mul_rn(value(0, mi, ni, 2 * h), value(1, mi, ni, 2 * h));
          v1 = silu_mul_rn(value(0, mi, ni, 2 * h + 1), value(1, mi, ni, 2 * h + 1));
        } else {
          v0 = value(0, mi, ni, 2 * h);
          v1 = value(0, mi, ni, 2 * h + 1);
        }
        if (n + 1 < N && vec2) {
          *reinterpret_cast<float2*>(orow + n) = make_float2(v0, v1);
        } else {
          orow[n] = v0;
          if (n + 1 < N) orow[n + 1] = v1;
        }
      }
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------

struct Workspace {
  int32_t* ids;
  float* weights;
  int32_t* order;
  int32_t* num_tiles;
  int32_t* tile_expert;
  int32_t* tile_start;
  int32_t* tile_count;
  float* act;
  float* y;
};

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

// The buffers in order; base == nullptr only sizes them.
size_t carve(void* base, const MoeShape& s, int max_tokens, Workspace* w) {
  const size_t slots = size_t(max_tokens) * size_t(s.top_k);
  const size_t tiles = size_t(max_tiles(int(slots), s.num_experts, kBM));
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* r = base ? static_cast<uint8_t*>(base) + off : nullptr;
    off += round256(bytes);
    return r;
  };
  Workspace tmp;
  Workspace& o = w ? *w : tmp;
  o.ids = static_cast<int32_t*>(take(slots * 4));
  o.weights = static_cast<float*>(take(slots * 4));
  o.order = static_cast<int32_t*>(take(slots * 4));
  o.num_tiles = static_cast<int32_t*>(take(4));
  o.tile_expert = static_cast<int32_t*>(take(tiles * 4));
  o.tile_start = static_cast<int32_t*>(take(tiles * 4));
  o.tile_count = static_cast<int32_t*>(take(tiles * 4));
  o.act = static_cast<float*>(take(slots * size_t(s.intermediate) * 4));
  o.y = static_cast<float*>(take(slots * size_t(s.hidden) * 4));
  return off;
}

bool projection_ok(const DeviceLinear& d, quant::WeightFormat f, int64_t N, int64_t K) {
  if (d.format != f || d.N != N || d.K != K || K % 16 != 0) return false;
  switch (f) {
    case quant::WeightFormat::GptqInt4:
      return d.g_idx.size() == 0 && (d.group_size == 32 || d.group_size == 64 || d.group_size == 128) &&
             K % d.group_size == 0 && N % 8 == 0 && d.qweight.size() > 0 && d.scales.size() > 0 &&
             (d.sym || d.qzeros.size() > 0);
    case quant::WeightFormat::Fp8Block:
      return d.fp8.size() > 0 && d.scale.size() > 0;
    case quant::WeightFormat::Dense:
    case quant::WeightFormat::Nvfp4:  // dequantised to bf16 at load
      return d.dense.size() > 0;
    default:
      return false;
  }
}

template <BFmt F>
void launch_experts(const float* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                    float* act, float* y, cudaStream_t stream) {
  const dim3 gu_grid(unsigned((s.intermediate + 63) / 64), unsigned(grid_tiles));
  moe_mma_kernel<2, 64, F><<<gu_grid, kThreads, 0, stream>>>(x, s.top_k, tiles, view_of(ex.gate), view_of(ex.up), act);
  MOESERVE_CUDA_CHECK_LAUNCH();
  const dim3 down_grid(unsigned((s.hidden + 127) / 128), unsigned(grid_tiles));
  const ExpertView dv = view_of(ex.down);
  moe_mma_kernel<1, 128, F><<<down_grid, kThreads, 0, stream>>>(act, s.top_k, tiles, dv, dv, y);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t moe_mma_workspace_bytes(const MoeShape& s, int max_tokens) { return carve(nullptr, s, max_tokens, nullptr); }

bool moe_routed_experts_mma(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex,
                            int M, void* workspace, size_t workspace_bytes, float* residual, cudaStream_t stream,
                            const float* shared_out, const float* shared_gate_logit) {
  const quant::WeightFormat f = ex.gate.format;
  const int64_t H = s.hidden, I = s.intermediate;
  if (H <= 0 || I <= 0 || !projection_ok(ex.gate, f, I, H) || !projection_ok(ex.up, f, I, H) ||
      !projection_ok(ex.down, f, H, I))
    return false;
  if (f == quant::WeightFormat::GptqInt4 &&
      (ex.gate.group_size != ex.up.group_size))  // the gate_up kernel reads one group size for both
    return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
  if ((shared_out == nullptr) != (shared_gate_logit == nullptr))
    throw Error("moe_mma: the shared expert output and its gate logit come together");
  if (M < 0) throw Error("moe_mma: negative M");
  if (M == 0) return true;
  if (s.top_k > kMaxTopK || s.top_k <= 0) throw Error("moe_mma: top_k must be in 1..32");
  if (s.num_experts > kMaxExperts) throw Error("moe_mma: more than 1024 experts are not supported");
  if (workspace_bytes < moe_mma_workspace_bytes(s, M)) throw Error("moe_mma: workspace too small");
  const long long slots = (long long)M * s.top_k;
  const long long grid_tiles = (slots + kBM - 1) / kBM + std::min<long long>(slots, s.num_experts);
  if (grid_tiles > 65535) throw Error("moe_mma: too many tokens for one launch");
  Workspace w;
  carve(workspace, s, M, &w);
  route_and_group(router_logits, s, M, kBM, w.ids, w.weights, w.num_tiles, w.tile_expert, w.tile_start, w.tile_count,
                  w.order, stream);
  const TileList tiles{w.num_tiles, w.tile_expert, w.tile_start, w.tile_count, w.order};
  switch (f) {
    case quant::WeightFormat::GptqInt4:
      launch_experts<BFmt::Gptq>(x, s, ex, tiles, int(grid_tiles), w.act, w.y, stream);
      break;
    case quant::WeightFormat::Fp8Block:
      launch_experts<BFmt::Fp8>(x, s, ex, tiles, int(grid_tiles), w.act, w.y, stream);
      break;
    default:
      launch_experts<BFmt::Bf16>(x, s, ex, tiles, int(grid_tiles), w.act, w.y, stream);
      break;
  }
  combine_routed(w.y, w.weights, s, M, residual, shared_out, shared_gate_logit, stream);
  return true;
}

}  // namespace moeserve::cuda
