// Grouped W4A16 expert kernels for GPTQ/AutoRound INT4 experts in the checkpoint's own layout
// (qweight [E][K/8][N] int32, nibble j of word (kp, n) = q[8kp + j, n]; scales f16 [E][K/g][N];
// qzeros [E][K/g][N/8]). Used when K % 64 == 0, there is no act-order g_idx and the group
// is a multiple of 8 (gptq_fast_path); other GPTQ experts take the generic kernels.
//
// Parallelisation: a CTA is (expert tile, 32 output columns); lane = column n, so a warp reads
// one packed row of 32 consecutive words (128 B, coalesced); the 8 warps split K into 8
// contiguous ranges, each summed in ascending k, and warp 0 adds the 8 partials in warp order.
// Activations are the same for all 32 lanes: every x load is a broadcast (L1), so x traffic
// does not grow with the weight bytes. Each weight word is dequantised once per tile and used
// for all (<= 8) tokens of the tile: an expert's weights are read once per step per 8 tokens.
// Dequantisation: nibble pairs (j, j+4) become the f16 pair (1024+q) by a mask-or, minus
// (1024+zero) gives q - zero exactly; sums over a block of words inside one group are scaled
// once: acc += s_g · Σ (q - z)·x. Symmetric projections (zero 8) use dequant8_const_zero
// instead (an exponent-field OR and one FADD per nibble: the same exact f32 values, about 25
// instead of 31 instructions per word with its 8 FMAs; ops_moe_internal.cuh, ops_moe_decode.cu).
// A token's sums depend only on its own row (batch invariant).
// Roofline (decode): the selected experts' packed weights + scales, read once:
//   slots_distinct · (2·I·H + H·I) / 2 bytes per layer (+ 1/32 of that for the f16 scales at g128).
//
// Decode tiles (MT = kSmallTile) are latency-bound, not bandwidth-bound: a CTA moves only
// 32 columns x K/8 rows, so the kernel time is the chain of dependent loads. Their kernels
//   - read the tile's metadata (num_tiles, expert, start, count) in one round, not three;
//   - prefetch into L2, as soon as the expert is known, every weight row (and scale) the warp
//     will read, 32 bytes per prefetch spread over the lanes (no registers held), before the
//     x rows are staged: DRAM sees all of a CTA's bytes at once instead of two chunks per lane;
//   - (gate_up prefetching the expert's down projection as well was measured slower on the H200:
//     122B batch 1 150.6 vs 152.7 tok/s, batch 8 281.7 vs 285.0; docs/PERF.md run I);
//   - gate_up walks the warp's range in chunks of up to kChunkDecode (16) packed rows, two in
//     flight (<= 128 registers, 2 CTAs of 256 threads per SM); down keeps 8-row chunks (its
//     range is K/64 = 16 rows at I = 1024: both chunks in flight at once) at 4 CTAs per SM.
// DRAM bytes are unchanged (each byte is still read from DRAM once; the kernels' own loads of
// prefetched lines are L2 hits); the extra cost is the prefetch instructions (per lane: ~1 per
// 8 weight words of its range).
// The chunk size only groups loads: the arithmetic (rows in ascending k, one serial f32 chain
// per scale block, acc = fma(block_sum, scale, acc), warp partials added in warp order) is the
// same for MT = 2 and MT = 8, so a token's bits do not depend on the tile size or M.
// It is also a contract with ops_moe_decode.cu, which serves generated-token steps of <= 8
// tokens (two launches, routing and combine fused) and must give the same bits: change the
// two together. These kernels serve larger steps and the shapes the decode kernels refuse.
// L2 footprint of the prefetches: the step's expert bytes (well under the L2 size).
#include <numeric>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/l2_prefetch.cuh"
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda::moe_detail {
namespace {

constexpr int kWarps = 8;
constexpr int kCols = 32;

__device__ __forceinline__ __half2 zero_pair(const ExpertView& w, int e, int g, int n, bool sym) {
  int z = 8;
  if (!sym) {
    const int groups = w.K / w.group;
    z = int((uint32_t(w.qzeros[(size_t(e) * groups + g) * (w.N / 8) + n / 8]) >> (4 * (n % 8))) & 0xF) + 1;
  }
  return __float2half2_rn(1024.0f + float(z));
}

// Accumulates Σ_k W[n,k]·x_j[k] over this warp's K range [kp0, kp1) (packed rows) for up to
// kTokenTile rows x_j and NP projections sharing the same x (gate and up: NP = 2). The range
// is walked in chunks of `step` packed rows (a power of two <= kChunk dividing `block`, the
// packed rows per scale block), and the next chunk's words are loaded before the current one
// is computed (software pipelining: two chunks in flight per lane).
constexpr int kChunk = 8;         // 8-token tiles (register bound)
constexpr int kChunkDecode = 16;  // decode tiles: fewer dependent rounds per warp

// L2 prefetch of the warp's packed rows [kp0, kp1) of NP projections for the CTA's columns
// [n0, n0 + 32) ∩ [0, N) (32-byte sectors, ascending rows over the lanes), plus the first
// and last scale of each (projection, group) those rows touch. n0 % 32 == 0 and N % 8 == 0,
// so every row's slice starts on a sector.
template <int NP>
__device__ __forceinline__ void prefetch_warp_range(const ExpertView (&w)[NP], int e, int n0, int kp0, int kp1,
                                                    int lane) {
  const int K = w[0].K, N = w[0].N, groups = K / w[0].group;
  const int cols = min(kCols, N - n0);
  const int sectors = cols / 8;  // 8 words per sector
  const int per_row = NP * sectors;
  const int items = (kp1 - kp0) * per_row;
  for (int i = lane; i < items; i += 32) {
    const int r = i / per_row, p = (i % per_row) / sectors, sec = i % sectors;
    const int32_t* q = p == 0 ? w[0].qweight : w[NP - 1].qweight;  // no dynamic index: w stays in registers
    prefetch_l2(q + (size_t(e) * (K / 8) + kp0 + r) * N + n0 + 8 * sec);
  }
  const int g0 = kp0 * 8 / w[0].group, ng = (kp1 * 8 - 1) / w[0].group - g0 + 1;
  for (int i = lane; i < NP * ng * 2; i += 32) {
    const int p = i / (2 * ng), g = g0 + (i / 2) % ng, end = i % 2;
    const __half* sc = p == 0 ? w[0].scales : w[NP - 1].scales;
    prefetch_l2(sc + (size_t(e) * groups + g) * N + n0 + end * (cols - 1));
  }
}


// kXShared: the x rows live in shared memory (read with plain loads; __ldg is global-only).
// kSym: symmetric weights (zero 8, `sym` true), dequantised by dequant8_const_zero: the same f32
// (q - 8) values as dequant8, fewer instructions (ops_moe_internal.cuh).
template <int NP, int MT, typename T, bool kXShared, int CH, bool kSym>
__device__ __forceinline__ void warp_range_dot(const ExpertView (&w)[NP], int e, int n, bool col_ok, int kp0, int kp1,
                                               int block, int step, const T* const (&xrow)[MT], int tn, bool sym,
                                               float (&acc)[NP][MT]) {
  const int K = w[0].K, N = w[0].N, groups = K / w[0].group;
  uint32_t cur[NP][CH], nxt[NP][CH];
  auto load = [&](int kq, uint32_t (&dst)[NP][CH]) {
#pragma unroll
    for (int p = 0; p < NP; ++p)
#pragma unroll
      for (int u = 0; u < CH; ++u)
        dst[p][u] = (col_ok && u < step) ? uint32_t(__ldg(w[p].qweight + (size_t(e) * (K / 8) + kq + u) * N + n))
                                         : 0x88888888u;
  };
  if (kp0 < kp1) load(kp0, cur);
  float s[NP], bs[NP][MT];
  __half2 zz[NP];
  NibbleExp nexp;
  if constexpr (kSym) nexp = nibble_exponents();
  for (int kq = kp0; kq < kp1; kq += step) {
    if ((kq - kp0) % block == 0) {  // a new scale block
      const int g = kq * 8 / w[0].group;
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        s[p] = col_ok ? __half2float(w[p].scales[(size_t(e) * groups + g) * N + n]) : 0.0f;
        if constexpr (!kSym) zz[p] = col_ok ? zero_pair(w[p], e, g, n, sym) : __float2half2_rn(1032.0f);
#pragma unroll
        for (int j = 0; j < MT; ++j) bs[p][j] = 0.0f;
      }
    }
    const bool more = kq + step < kp1;
    if (more) load(kq + step, nxt);
#pragma unroll
    for (int u = 0; u < CH; ++u) {
      if (u >= step) break;
      float f[NP][8];
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        if constexpr (kSym)
          dequant8_const_zero<8>(cur[p][u], nexp, f[p]);  // absent words (0x88888888) give 0, as in dequant8
        else
          dequant8(cur[p][u], zz[p], f[p]);
      }
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        if (j >= tn) break;
        float xv[8];
        if constexpr (kXShared) {
          const float4* xp = reinterpret_cast<const float4*>(xrow[j] + (kq + u) * 8);
          const float4 a = xp[0], b = xp[1];
          xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
        } else {
          load8(xrow[j] + (kq + u) * 8, xv);
        }
#pragma unroll
        for (int p = 0; p < NP; ++p) {
          float a = bs[p][j];
#pragma unroll
          for (int i = 0; i < 8; ++i) a = fmaf(f[p][i], xv[i], a);
          bs[p][j] = a;
        }
      }
    }
    if ((kq + step - kp0) % block == 0) {  // the block ends: scale its sums once
#pragma unroll
      for (int p = 0; p < NP; ++p)
#pragma unroll
        for (int j = 0; j < MT; ++j) acc[p][j] = fmaf(bs[p][j], s[p], acc[p][j]);
    }
    if (more) {
#pragma unroll
      for (int p = 0; p < NP; ++p)
#pragma unroll
        for (int u = 0; u < CH; ++u) cur[p][u] = nxt[p][u];
    }
  }
}

struct RangePlan {
  int words_per_warp;  // contiguous packed rows per warp
  int block;           // packed rows per scale block (divides words_per_warp, inside one group)
  int step;            // packed rows per chunk: the largest power of two <= chunk dividing block
};

// chunk: the kernel's chunk capacity (kChunk or kChunkDecode). It only groups the loads;
// words_per_warp and block (which fix the arithmetic) depend on K and the group alone.
RangePlan plan_for(int K, int group, int chunk) {
  const int per_warp = K / 8 / kWarps;
  const int block = std::gcd(per_warp, group / 8);
  int step = chunk;
  while (block % step) step /= 2;
  return {per_warp, block, step};
}

// Copies the tile's x rows into shared memory as f32 ([MT][K]); rows j >= tn are left unset.
template <int MT, typename T>
__device__ __forceinline__ void stage_x(const T* __restrict__ x, size_t row_stride, const int (&row)[MT], int tn, int K,
                                        float* xs) {
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    if (j >= tn) break;
    const T* src = x + size_t(row[j]) * row_stride;
    for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4) {
      float4 v;
      if constexpr (std::is_same_v<T, float>) {
        v = __ldg(reinterpret_cast<const float4*>(src + i));
      } else {
        v = make_float4(to_f32(src[i]), to_f32(src[i + 1]), to_f32(src[i + 2]), to_f32(src[i + 3]));
      }
      *reinterpret_cast<float4*>(xs + size_t(j) * K + i) = v;
    }
  }
  __syncthreads();
}

// x rows staged in shared memory when MT·K floats fit in kSmemXBytes (decode tiles): every x
// read is then a shared-memory broadcast with 32-bit addressing instead of a global one.
constexpr int kSmemXBytes = 40 * 1024;

template <int MT>
constexpr bool kDecode = MT <= kSmallTile;
// Chunk capacity of gate_up (decode: 16 rows, two chunks in flight). The down kernel keeps
// kChunk: its warp range is K/64 rows (16 at I = 1024), already all in flight in two chunks.
template <int MT>
constexpr int kChunkOf = kDecode<MT> ? kChunkDecode : kChunk;

// The tile's metadata, all four loads issued before any is used (one round). The TileList
// arrays hold grid_tiles entries, so expert/start/count[t] are in bounds even for t past
// *num_tiles (their values are then unused).
struct TileMeta {
  bool live;
  int e, first, tn;
};
__device__ __forceinline__ TileMeta tile_meta(const TileList& tiles, int t) {
  const int num = __ldg(tiles.num_tiles);
  const int e = __ldg(tiles.expert + t), first = __ldg(tiles.start + t), tn = __ldg(tiles.count + t);
  return {t < num, e, first, tn};
}

// Decode tiles (MT = 2) ask for 2 CTAs per SM (<= 128 registers: 16-row chunks), 8-token tiles for 2.
// kSym: gate and up are both symmetric (gptq_gate_up dispatches on it).
template <int MT, bool kSmemX, typename T, bool kSym>
__global__ void __launch_bounds__(kWarps * 32, 2)
    gptq_gate_up_kernel(const T* __restrict__ x, int k_top, TileList tiles, ExpertView gate, ExpertView up,
                        ExpertView down, RangePlan plan, float* __restrict__ act) {
  extern __shared__ float xs[];  // [MT][H] when kSmemX
  const int t = blockIdx.x;
  const TileMeta meta = tile_meta(tiles, t);
  if (!meta.live) return;
  const int e = meta.e, first = meta.first, tn = meta.tn;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int I = gate.N, H = gate.K;
  const int n0 = blockIdx.y * kCols, n = n0 + lane;
  const bool col_ok = n < I;
  const ExpertView w[2] = {gate, up};
  const int kp0 = warp * plan.words_per_warp;
  if constexpr (kDecode<MT>) {
    prefetch_warp_range<2>(w, e, n0, kp0, kp0 + plan.words_per_warp, lane);
  }
  int slot[MT], token[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    slot[j] = j < tn ? tiles.order[first + j] : 0;
    token[j] = slot[j] / k_top;
  }
  float acc[2][MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[0][j] = acc[1][j] = 0.0f;
  constexpr int CH = kChunkOf<MT>;
  if constexpr (kSmemX) {
    stage_x<MT, T>(x, size_t(H), token, tn, H, xs);
    const float* xrow[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j) xrow[j] = xs + size_t(j) * H;
    warp_range_dot<2, MT, float, true, CH, kSym>(w, e, n, col_ok, kp0, kp0 + plan.words_per_warp, plan.block,
                                                 plan.step, xrow, tn, gate.sym, acc);
  } else {
    const T* xrow[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j) xrow[j] = x + size_t(token[j]) * H;
    warp_range_dot<2, MT, T, false, CH, kSym>(w, e, n, col_ok, kp0, kp0 + plan.words_per_warp, plan.block,
                                              plan.step, xrow, tn, gate.sym, acc);
  }

  __shared__ float partial[kWarps][2][MT][kCols];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    partial[warp][0][j][lane] = acc[0][j];
    partial[warp][1][j][lane] = acc[1][j];
  }
  __syncthreads();
  if (warp == 0 && col_ok) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      if (j >= tn) break;
      float g = 0.0f, u = 0.0f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) {
        g += partial[v][0][j][lane];
        u += partial[v][1][j][lane];
      }
      act[size_t(slot[j]) * I + n] = silu_mul(g, u);
    }
  }
}

// Decode tiles ask for 4 CTAs per SM (<= 64 registers: one projection, 8-row chunks), 8-token tiles for 2.
template <int MT, bool kSmemX, bool kSym>
__global__ void __launch_bounds__(kWarps * 32, kDecode<MT> ? 4 : 2)
    gptq_down_kernel(const float* __restrict__ act, TileList tiles, ExpertView down, RangePlan plan,
                     float* __restrict__ y) {
  extern __shared__ float xs[];  // [MT][I] when kSmemX
  const int t = blockIdx.x;
  const TileMeta meta = tile_meta(tiles, t);
  if (!meta.live) return;
  const int e = meta.e, first = meta.first, tn = meta.tn;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int H = down.N, I = down.K;
  const int n0 = blockIdx.y * kCols, n = n0 + lane;
  const bool col_ok = n < H;
  const ExpertView w[1] = {down};
  const int kp0 = warp * plan.words_per_warp;
  // The warp's own rows, into L2 before the activations are staged (as in gate_up).
  if constexpr (kDecode<MT>) prefetch_warp_range<1>(w, e, n0, kp0, kp0 + plan.words_per_warp, lane);
  int slot[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) slot[j] = j < tn ? tiles.order[first + j] : 0;
  float acc[1][MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[0][j] = 0.0f;
  const float* xrow[MT];
  if constexpr (kSmemX) {
    stage_x<MT, float>(act, size_t(I), slot, tn, I, xs);
#pragma unroll
    for (int j = 0; j < MT; ++j) xrow[j] = xs + size_t(j) * I;
  } else {
#pragma unroll
    for (int j = 0; j < MT; ++j) xrow[j] = act + size_t(slot[j]) * I;
  }
  warp_range_dot<1, MT, float, kSmemX, kChunk, kSym>(w, e, n, col_ok, kp0, kp0 + plan.words_per_warp, plan.block,
                                                      plan.step, xrow, tn, down.sym, acc);

  __shared__ float partial[kWarps][MT][kCols];
#pragma unroll
  for (int j = 0; j < MT; ++j) partial[warp][j][lane] = acc[0][j];
  __syncthreads();
  if (warp == 0 && col_ok) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      if (j >= tn) break;
      float v = 0.0f;
#pragma unroll
      for (int u = 0; u < kWarps; ++u) v += partial[u][j][lane];
      y[size_t(slot[j]) * H + n] = v;
    }
  }
}

bool proj_ok(const DeviceLinear& d) {
  return d.format == quant::WeightFormat::GptqInt4 && d.g_idx.size() == 0 && d.K % (8 * kWarps) == 0 &&
         d.group_size % 8 == 0 && d.group_size > 0 && d.K % d.group_size == 0 && d.N % 8 == 0;
}

}  // namespace

bool gptq_fast_path(const DeviceExperts& ex) { return proj_ok(ex.gate) && proj_ok(ex.up) && proj_ok(ex.down); }

template <int MT, typename T>
void launch_gate_up(const T* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, dim3 grid,
                    float* act, cudaStream_t stream) {
  const RangePlan plan = plan_for(s.hidden, int(ex.gate.group_size), kChunkOf<MT>);
  const size_t xs_bytes = size_t(MT) * size_t(s.hidden) * sizeof(float);
  // Symmetric gate and up take dequant8_const_zero (same values); otherwise zeros as gate.sym says.
  const bool sym = ex.gate.sym && ex.up.sym;
  const bool smem_x = xs_bytes <= size_t(kSmemXBytes);
  auto kernel = smem_x ? (sym ? gptq_gate_up_kernel<MT, true, T, true> : gptq_gate_up_kernel<MT, true, T, false>)
                       : (sym ? gptq_gate_up_kernel<MT, false, T, true> : gptq_gate_up_kernel<MT, false, T, false>);
  kernel<<<grid, kWarps * 32, smem_x ? xs_bytes : 0, stream>>>(x, s.top_k, tiles, view_of(ex.gate), view_of(ex.up),
                                                               view_of(ex.down), plan, act);
}

template <typename T>
void gptq_gate_up(const T* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                  int tile, float* act, cudaStream_t stream) {
  const dim3 grid(unsigned(grid_tiles), unsigned((s.intermediate + kCols - 1) / kCols));
  if (tile <= kSmallTile)
    launch_gate_up<kSmallTile, T>(x, s, ex, tiles, grid, act, stream);
  else
    launch_gate_up<kTokenTile, T>(x, s, ex, tiles, grid, act, stream);
  MOESERVE_CUDA_CHECK_LAUNCH();
}
template void gptq_gate_up<float>(const float*, const MoeShape&, const DeviceExperts&, const TileList&, int, int,
                                  float*, cudaStream_t);
template void gptq_gate_up<bf16>(const bf16*, const MoeShape&, const DeviceExperts&, const TileList&, int, int, float*,
                                 cudaStream_t);

template <int MT>
void launch_down(const float* act, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, dim3 grid,
                 float* y, cudaStream_t stream) {
  const RangePlan plan = plan_for(s.intermediate, int(ex.down.group_size), kChunk);
  const size_t xs_bytes = size_t(MT) * size_t(s.intermediate) * sizeof(float);
  const bool sym = ex.down.sym, smem_x = xs_bytes <= size_t(kSmemXBytes);
  auto kernel = smem_x ? (sym ? gptq_down_kernel<MT, true, true> : gptq_down_kernel<MT, true, false>)
                       : (sym ? gptq_down_kernel<MT, false, true> : gptq_down_kernel<MT, false, false>);
  kernel<<<grid, kWarps * 32, smem_x ? xs_bytes : 0, stream>>>(act, tiles, view_of(ex.down), plan, y);
}

void gptq_down(const float* act, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
               int tile, float* y, cudaStream_t stream) {
  const dim3 grid(unsigned(grid_tiles), unsigned((s.hidden + kCols - 1) / kCols));
  if (tile <= kSmallTile)
    launch_down<kSmallTile>(act, s, ex, tiles, grid, y, stream);
  else
    launch_down<kTokenTile>(act, s, ex, tiles, grid, y, stream);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda::moe_detail
