// The swapAB expert kernels of moe_routed_experts_mma's variant 8 (ops_moe_mma_swap.cu): GPTQ INT4
// experts at decode sizes (<= 4 slots per expert on average) on tensor cores with the weights as
// the MMA's A operand and a tile's slots as its B operand, giving every output the bits of the
// word form (ops_moe_mma.cu kernel form 3). Internal to the MoE ops; include from .cu files only.
#pragma once
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda::moe_detail {

// Slots per swap tile (route_and_group with this tile size at M > kSwapFusedMaxTokens; the
// TileList arrays sized by max_tiles(M·k, E, kSwapTile)). Half of the n8 B fragment: the tile's x
// rows fit shared memory as bf16 hi / lo planes (4 x K x 4 bytes).
constexpr int kSwapTile = 4;
// Up to this many tokens (and E <= 256) the gate_up kernel routes itself, one CTA row per slot
// (no grouping launch): two launches in all.
constexpr int kSwapFusedMaxTokens = 8;

// Whether the swap kernels serve these experts: GPTQ INT4 without act-order, groups 32 / 64 / 128
// (gate and up of one group size), H and I multiples of 32, and the kernels' shared memory (the
// tile's activation planes, 16·(K + 8) bytes, next to the C and scale buffers) within 99 KB for
// K = H and K = I. (moe_routed_experts_mma checks it before it routes.)
bool swap_supported(const MoeShape& s, const DeviceExperts& ex);
// Whether a step of M tokens takes the fused-routing form (M <= kSwapFusedMaxTokens, E <= 256).
inline bool swap_fused_routing(const MoeShape& s, int M) {
  return M <= kSwapFusedMaxTokens && s.num_experts <= 256;
}
// int32 arrival counters the down kernel needs in the workspace: one per (token, 32 columns of H).
inline size_t swap_arrival_count(const MoeShape& s, int max_tokens) {
  return size_t(max_tokens) * size_t((s.hidden + 31) / 32);
}

// Workspace buffers of one call. ids / weights [M·k] (the fused form writes them, the tiled form
// reads route_and_group's); act_hi / act_lo bf16 [M·k, I] (by order position; fused: by slot),
// each 32-k block permuted (kperm32_logical); y f32 [M·k, H] by slot; arrivals [M][H/32] int32
// (any contents on entry: gate_up zeroes them; a call leaves them at zero).
struct SwapBuffers {
  int32_t* ids;
  float* weights;
  bf16* act_hi;
  bf16* act_lo;
  float* y;
  int32_t* arrivals;
};

// The routed experts of M tokens: gate_up then down with the combine (residual[m] += Σ_r w·y (+
// sigmoid(gate)·shared), combine_routed's arithmetic). tiles == nullptr: the fused-routing form
// (swap_fused_routing must hold; grid_tiles unused); else route_and_group's tiles of <= kSwapTile
// slots and their grid size. x f32 [M, H] (16-byte aligned).
void swap_experts(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
                  const TileList* tiles, int grid_tiles, const SwapBuffers& b, float* residual,
                  const float* shared_out, const float* shared_gate_logit, cudaStream_t stream);
// Opts the swap kernels in to their dynamic shared memory on the current device (moe_mma_prepare).
void swap_prepare();
// Column blocks (gate_up: 16 gate + 16 up columns; down: 32 columns) per CTA: 0 (default) chosen
// per launch from the grid and the device, 1 .. 8 forced (tests, benchmarks). Every value gives the
// same bits. Process-wide, like set_moe_mma_variant.
void set_swap_columns_per_cta(int nc);
int swap_columns_per_cta();

}  // namespace moeserve::cuda::moe_detail
