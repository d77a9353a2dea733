// Internals shared by the routed-expert kernels (ops_moe*.cu): the device view of one stacked
// projection, the per-step expert tiles and the element-wise dequantisation used by the
// generic kernels. Device code; include from .cu files only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>

#include "backend/cuda/act_types.cuh"
#include "backend/cuda/ops_moe.h"

namespace moeserve::cuda::moe_detail {

// Tokens of one expert that share one pass over its weights (decode: one tile per selected
// expert). A token's sums never depend on the tile it lands in (batch invariance).
constexpr int kTokenTile = 8;  // the largest tile
constexpr int kSmallTile = 2;  // decode-sized steps (<= 8 tokens): fewer registers, more warps
constexpr int kMaxTopK = 32;
constexpr int kMaxExperts = 1024;

struct ExpertView {  // one stacked projection, device pointers only (kernel argument)
  int format;        // quant::WeightFormat
  int N, K, group;
  bool sym;
  const bf16* dense;
  const int32_t* qweight;
  const __half* scales;
  const int32_t* qzeros;
  const int32_t* g_idx;  // GPTQ act-order: [E][K] group of each k (null: k / group)
  const uint8_t* fp8;
  const float* scale;
};

inline ExpertView view_of(const DeviceLinear& d) {
  return {int(d.format), int(d.N), int(d.K), int(d.group_size), d.sym, d.dense.data(), d.qweight.data(),
          d.scales.data(), d.qzeros.data(), d.g_idx.size() ? d.g_idx.data() : nullptr, d.fp8.data(), d.scale.data()};
}

// The step's expert tiles, built on the device (no host synchronisation): tile t covers
// order[start[t] .. start[t] + count[t]) of expert[t]; order lists slots (token·k + rank).
// Launches size their grids for max_tiles and CTAs at or past *num_tiles exit at once.
struct TileList {
  const int32_t* num_tiles;
  const int32_t* expert;
  const int32_t* start;
  const int32_t* count;
  const int32_t* order;
};

// Upper bound of the tile count for tiles of `tile` slots: every active expert adds at most
// one partial tile.
inline int max_tiles(int slots, int num_experts, int tile = kSmallTile) {
  return (slots + tile - 1) / tile + (slots < num_experts ? slots : num_experts);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + __expf(-g)) * u; }
// The tensor-core expert kernels' SwiGLU (ops_moe_mma.cu, ops_moe_mma_swap.cu: one definition, so
// both give the same bits): explicit roundings, silu(g)·u = (g / (1 + e^-g))·u.
__device__ __forceinline__ float silu_mul_rn(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, __expf(-g))), u);
}

// Routing of one token, shared by the grouping CTA, moe_route_kernel (ops_moe.cu) and the
// decode kernels (ops_moe_decode.cu), so every path gets the same ids and weight bits: lane L
// holds logits L, L+32, ...; fp32 softmax (max, accurate expf, the denominator summed per lane
// then by a fixed shuffle tree), k rounds of a warp arg-max (equal p: lower expert id, as
// torch.topk), weights renormalised over the k in rank order. Call from a whole warp; lane 0
// writes ids[0..k) and weights[0..k) (global or shared memory).
//
// route_softmax is its first half, shared with the integer-form decode kernels' routing
// (ops_moe_int_decode.cu): lane L's probabilities p[i] of experts L + 32·i (-1 past E). kCg: the
// logits through L2 (ld.global.cg), for a kernel that reads what the previous kernel wrote.
template <int kPerLane, bool kCg = false>
__device__ __forceinline__ void route_softmax(const float* __restrict__ row, int E, float (&p)[kPerLane]) {
  const int lane = threadIdx.x & 31;
  float mx = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? (kCg ? __ldcg(row + e) : row[e]) : -FLT_MAX;
    mx = fmaxf(mx, p[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float denom = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? expf(p[i] - mx) : 0.0f;
    denom += p[i];
  }
  denom = warp_sum(denom);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) p[i] = lane + 32 * i < E ? p[i] / denom : -1.0f;
}

template <int kPerLane>  // logits per lane: ceil(E / 32) <= kPerLane
__device__ __forceinline__ void route_token(const float* __restrict__ row, int E, int k, int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  float p[kPerLane];
  route_softmax<kPerLane>(row, E, p);
  float psum = 0.0f, chosen_p[kMaxTopK];
  int chosen[kMaxTopK];
  for (int r = 0; r < k; ++r) {
    float bp = -1.0f;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (p[i] > bp) {  // ascending ids within the lane: strict keeps the lower id
        bp = p[i];
        bi = lane + 32 * i;
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (op > bp || (op == bp && oi < bi)) {
        bp = op;
        bi = oi;
      }
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i == bi) p[i] = -1.0f;  // taken
    chosen[r] = bi;
    chosen_p[r] = bp;
  }
  for (int r = 0; r < k; ++r) psum += chosen_p[r];
  if (lane == 0)
    for (int r = 0; r < k; ++r) {
      ids[r] = chosen[r];
      weights[r] = chosen_p[r] / psum;
    }
}

// Routes one token: the per-lane register count follows E (8 logits per lane for E <= 256).
__device__ __forceinline__ void route_any(const float* row, int E, int k, int32_t* ids, float* weights) {
  if (E <= 256)
    route_token<8>(row, E, k, ids, weights);
  else if (E <= 512)
    route_token<16>(row, E, k, ids, weights);
  else
    route_token<kMaxExperts / 32>(row, E, k, ids, weights);
}

// GPTQ INT4: eight (q - zero) values of one packed word (8 consecutive k of one column), in k
// order, exactly: nibble pairs (j, j+4) become the f16 pair (1024 + q) by a mask-or, minus
// zz = (1024 + zero, 1024 + zero).
__device__ __forceinline__ void dequant8(uint32_t w, __half2 zz, float (&f)[8]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    uint32_t bits = ((w >> (4 * p)) & 0x000F000Fu) | 0x64006400u;  // (1024 + q_p, 1024 + q_{p+4})
    const __half2 h = __hsub2(*reinterpret_cast<__half2*>(&bits), zz);
    const float2 v = __half22float2(h);
    f[p] = v.x;
    f[p + 4] = v.y;
  }
}

// GPTQ INT4 with zero point Z (a compile-time constant: symmetric GPTQ has Z = 8): the same
// eight exact (q - Z) f32 values as dequant8, in k order, in fewer instructions. Nibble j of a
// word sits at bits 4j..4j+3; OR-ing the exponent field 150 - 4j (NibbleExp) into w & (0xF << 4j)
// gives a float whose mantissa step at bit 4j is worth exactly 1, i.e. the value B_j + q with
// B_j = 2^(23 - 4j) (j = 0..4: the nibble lies inside the 23 mantissa bits). One FADD of the
// immediate -(B_j + Z) then gives q - Z exactly (both operands are integers below 2^24, the
// difference a small integer). Nibbles 5..7 take the same steps (as j = 0..2) from w >> 20.
// Per word: 8 LOP3 (mask immediate, exponent register) + 1 SHF + 8 FADD. The f32 values, hence
// every later FMA, are bit-identical to dequant8's.
struct NibbleExp {
  uint32_t e[5];  // exponent fields 150 - 4j << 23, j = 0..4
};
// The exponents in registers: built from a value the compiler cannot fold (blockDim.x >> 31 is
// 0 at run time), so each LOP3 takes its mask as the immediate and the exponent as a register;
// with literal constants ptxas spends a second instruction per nibble materialising one of them.
__device__ __forceinline__ NibbleExp nibble_exponents() {
  const uint32_t opaque_zero = blockDim.x >> 31;
  NibbleExp x;
#pragma unroll
  for (int j = 0; j < 5; ++j) x.e[j] = (0x4B000000u - 0x02000000u * uint32_t(j)) | opaque_zero;
  return x;
}
// (w & mask) | e as one LOP3: written as C++, ptxas for sm_121 emitted two instructions per
// nibble even with e in a register (the sm_90 code was one); the explicit lop3 is one on both.
__device__ __forceinline__ uint32_t and_or(uint32_t w, uint32_t mask, uint32_t e) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "r"(mask), "r"(e));  // 0xEA: (a & b) | c
  return r;
}
template <int Z>
__device__ __forceinline__ void dequant8_const_zero(uint32_t w, const NibbleExp& ex, float (&f)[8]) {
  constexpr float kBias[5] = {8388608.0f + Z, 524288.0f + Z, 32768.0f + Z, 2048.0f + Z, 128.0f + Z};
  const uint32_t hi = w >> 20;
#pragma unroll
  for (int j = 0; j < 5; ++j) f[j] = __uint_as_float(and_or(w, 0xFu << (4 * j), ex.e[j])) - kBias[j];
#pragma unroll
  for (int j = 0; j < 3; ++j) f[5 + j] = __uint_as_float(and_or(hi, 0xFu << (4 * j), ex.e[j])) - kBias[j];
}

// W_e[n, k] as fp32, element by element (the generic kernels' fallback).
__device__ __forceinline__ float expert_weight_at(const ExpertView& w, int e, int n, int k) {
  switch (w.format) {
    case int(quant::WeightFormat::GptqInt4): {
      const int groups = w.K / w.group;
      const uint32_t word = uint32_t(w.qweight[(size_t(e) * (w.K / 8) + k / 8) * w.N + n]);
      const int g = w.g_idx ? w.g_idx[size_t(e) * w.K + k] : k / w.group;
      const float s = __half2float(w.scales[(size_t(e) * groups + g) * w.N + n]);
      const int zero =
          w.sym ? 8 : int((uint32_t(w.qzeros[(size_t(e) * groups + g) * (w.N / 8) + n / 8]) >> (4 * (n % 8))) & 0xF) + 1;
      return float(int((word >> (4 * (k % 8))) & 0xF) - zero) * s;
    }
    case int(quant::WeightFormat::Fp8Block): {
      __nv_fp8_e4m3 f;
      f.__x = w.fp8[(size_t(e) * w.N + n) * w.K + k];
      const int nb = (w.N + 127) / 128, kb = (w.K + 127) / 128;
      return float(f) * w.scale[(size_t(e) * nb + n / 128) * kb + k / 128];
    }
    default:
      return __bfloat162float(w.dense[(size_t(e) * w.N + n) * w.K + k]);
  }
}

// Launchers of the expert kernels (ops_moe_gptq.cu, ops_moe_rows.cu). gate_up writes
// act[slot, I] = silu(gate·x)·(up·x); down writes y[slot, H] = down·act[slot].
bool gptq_fast_path(const DeviceExperts& ex);
// tile: the tile size the grouping used (kSmallTile or kTokenTile).
template <typename T>
void gptq_gate_up(const T* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                  int tile, float* act, cudaStream_t stream);
void gptq_down(const float* act, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
               int tile, float* y, cudaStream_t stream);
template <typename T>
void rows_gate_up(const T* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                  float* act, cudaStream_t stream);
void rows_down(const float* act, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
               float* y, cudaStream_t stream);

// Routing and grouping (ops_moe.cu): ids / weights [M·k] from the router logits (routed inside
// the grouping CTA when M <= 64 and E <= 256, else by moe_route_kernel first: the same
// route_token either way), then the step's tiles of up to `tile` slots of one expert
// (TileList arrays sized for max_tiles(M·k, E, tile); order [M·k]).
void route_and_group(const float* router_logits, const MoeShape& s, int M, int tile, int32_t* ids, float* weights,
                     int32_t* num_tiles, int32_t* tile_expert, int32_t* tile_start, int32_t* tile_count,
                     int32_t* order, cudaStream_t stream);
// Per-expert tile sizes (moe_routed_experts_mma variant 7): the same routing and the same order
// (each expert's slots contiguous), but TWO tile lists, so each expert's slots take as few weight
// passes as the two prompt tilings allow: an expert of c slots gets c / 64 tiles of 64 slots, then
// its remainder r = c % 64 one more 64-slot tile if r > 32, else (r = 1..32) one 32-slot tile.
// The 32-slot list is tile_expert / tile_start / tile_count [0, mixed_mid_cap) with its count in
// num_tiles[0]; the 64-slot list starts at index large_offset (>= mixed_mid_cap) with its count in
// num_tiles[1]. Every 64-slot tile holds >= 33 slots and an expert has at most one 32-slot tile,
// which bounds the two lists (mixed_*_cap: the grids of their launches). tile_start indexes the one
// order array in both lists, so a slot's order position p (its act row) is list-independent.
constexpr int kMixMid = 32, kMixLarge = 64;
inline int mixed_mid_cap(int slots, int num_experts) { return slots < num_experts ? slots : num_experts; }
inline int mixed_large_cap(int slots) { return slots / (kMixMid + 1); }
void route_and_group_mixed(const float* router_logits, const MoeShape& s, int M, int32_t* ids, float* weights,
                           int32_t* num_tiles, int32_t* tile_expert, int32_t* tile_start, int32_t* tile_count,
                           int large_offset, int32_t* order, cudaStream_t stream);
// Generated-token steps of GPTQ INT4 experts (ops_moe_decode.cu): routing inside the gate/up
// kernel, the combine inside the down kernel, two launches. Same bits per token as the tiled
// path (route_and_group + gptq_gate_up + gptq_down + combine_routed), which serves larger M.
constexpr int kDecodeMaxTokens = 8;
bool gptq_decode_supported(const MoeShape& s, const DeviceExperts& ex, int M);
// ids / weights: [M·k] (written), act: [M·k, I] (written); residual [M, H] += routed (+ gated shared).
// shared_ready (optional): the stream waits for it before the down kernel, which reads shared_out.
template <typename T>
void gptq_decode(const T* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
                 int32_t* ids, float* weights, float* act, float* residual, const float* shared_out,
                 const float* shared_gate_logit, cudaStream_t stream, cudaEvent_t shared_ready = nullptr);

// Generated-token steps of more than kDecodeMaxTokens tokens with GPTQ INT4 experts
// (ops_moe_grouped.cu): after route_and_group with tiles of kGroupedTile slots, gate/up and down
// kernels that read each tile's expert slice once for all its slots (act [M·k, I], y [M·k, H]
// by slot, as gptq_gate_up / gptq_down), the same bits per token as the tiled kernels; the
// caller adds the combine (combine_routed). grid_tiles: max_tiles(M·k, E, kGroupedTile).
constexpr int kGroupedTile = 4;
bool gptq_grouped_supported(const MoeShape& s, const DeviceExperts& ex);
template <typename T>
void gptq_grouped(const T* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                  float* act, float* y, cudaStream_t stream);

// The combine (ops_moe.cu): residual[m] += Σ_r weights[m·k + r]·y[m·k + r] in rank order, then
// (when shared_out) + sigmoid(shared_gate_logit[m])·shared_out[m]. y: f32 [M·k, H] by slot.
void combine_routed(const float* y, const float* weights, const MoeShape& s, int M, float* residual,
                    const float* shared_out, const float* shared_gate_logit, cudaStream_t stream);

}  // namespace moeserve::cuda::moe_detail
