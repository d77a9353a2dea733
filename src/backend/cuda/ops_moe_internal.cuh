// Internals shared by the routed-expert kernels (ops_moe*.cu): the device view of one stacked
// projection, the per-step expert tiles and the element-wise dequantisation used by the
// generic kernels. Device code; include from .cu files only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

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
// The combine (ops_moe.cu): residual[m] += Σ_r weights[m·k + r]·y[m·k + r] in rank order, then
// (when shared_out) + sigmoid(shared_gate_logit[m])·shared_out[m]. y: f32 [M·k, H] by slot.
void combine_routed(const float* y, const float* weights, const MoeShape& s, int M, float* residual,
                    const float* shared_out, const float* shared_gate_logit, cudaStream_t stream);

}  // namespace moeserve::cuda::moe_detail
