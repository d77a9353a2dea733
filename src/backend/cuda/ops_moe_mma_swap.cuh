// The swapAB expert kernels of moe_routed_experts_mma's variant 8 (ops_moe_mma_swap.cu): GPTQ INT4
// experts at decode sizes (<= 4 slots per expert on average) on tensor cores with the weights as
// the MMA's A operand and the tile's slots as its B operand, giving every output the bits of the
// word form (ops_moe_mma.cu kernel form 3). Internal to the MoE ops; include from .cu files only.
#pragma once
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda::moe_detail {

// Slots per swap tile: one n8 MMA fragment (route_and_group with this tile size; the TileList
// arrays sized by max_tiles(M·k, E, kSwapTile)).
constexpr int kSwapTile = 8;

// Whether the swap kernels serve these experts: GPTQ INT4 without act-order, groups 32 / 64 / 128
// (gate and up of one group size), H and I multiples of 32. (moe_routed_experts_mma checks the
// same before it routes; this is the kernels' own precondition.)
bool swap_supported(const MoeShape& s, const DeviceExperts& ex);

// act_hi / act_lo [M·k, I] bf16 by order position, each 32-k block permuted (kperm32_logical): the
// word form's down input. x f32 [M, H] (16-byte aligned); tiles of <= kSwapTile slots.
void swap_gate_up(const float* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                  bf16* act_hi, bf16* act_lo, cudaStream_t stream);
// y f32 [M·k, H] by slot, from the act planes swap_gate_up wrote (the same tiles).
void swap_down(const bf16* act_hi, const bf16* act_lo, const MoeShape& s, const DeviceExperts& ex,
               const TileList& tiles, int grid_tiles, float* y, cudaStream_t stream);
// Opts the swap kernels in to their dynamic shared memory on the current device (moe_mma_prepare).
void swap_prepare();

}  // namespace moeserve::cuda::moe_detail
