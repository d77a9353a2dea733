// Launchers of the integer-form routed-expert kernels (moe_int_arith.h; public entry
// moe_routed_experts_int in ops_moe.h, dispatched by ops_moe_int.cu). Both give a token the same
// bits (exact integer unit sums, one f32 fold), so the dispatcher may pick either for any step.
// Device code; include from .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/moe_int_arith.h"
#include "backend/cuda/ops_moe.h"
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda::moe_int_detail {

// Shapes both paths take (checked by the dispatcher before either launcher): GPTQ INT4 without
// act-order, gate and up of one group size and zero mode, unit_length(group) != 0 for gate/up and
// down, H and I multiples of kKStep and of their projections' unit (the last activation block of a
// row may be shorter than kXBlock), 1 <= top_k <= 32, E <= 256 (the fused routing).
bool int_form_supported(const MoeShape& s, const DeviceExperts& ex);

// CUDA-core (dp4a) kernels for steps of 1 .. kIntDecodeMaxTokens tokens (ops_moe_int_decode.cu):
// routing fused into gate/up, the combine into down: two launches, programmatic dependent launches.
constexpr int kIntDecodeMaxTokens = 8;
size_t int_decode_workspace_bytes(const MoeShape& s, int M);
// residual [M, H] += routed (+ sigmoid(shared_gate_logit)·shared_out when shared_out); the stream
// waits for shared_ready (when given) before the first kernel that reads shared_out.
void int_decode(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
                void* workspace, size_t workspace_bytes, float* residual, const float* shared_out,
                const float* shared_gate_logit, cudaStream_t stream, cudaEvent_t shared_ready);
// The streaming dp4a kernels (ops_moe_int_stream.cu; int_decode's default, the same bits and
// workspace): launches them and returns true, or returns false (launching nothing) when the variant
// is 0 (set_moe_int_decode_variant) or the shape does not fit them.
bool int_stream_serves(const MoeShape& s, const DeviceExperts& ex, int M);
// Whether a step of M tokens without the shared expert takes the fused one-token kernel (variant 2).
bool int_stream_fuses(const MoeShape& s, const DeviceExperts& ex, int M);
bool int_stream_decode(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
                       void* workspace, size_t workspace_bytes, float* residual, const float* shared_out,
                       const float* shared_gate_logit, cudaStream_t stream, cudaEvent_t shared_ready);

// The exact-integer-to-float bias of the tensor-core kernels' fold: an s32 accumulator holding
// kMagicBits + v (|v| < 2^22) is the float kMagic + v, so v = float − kMagic exactly.
constexpr int kMagicBits = 0x4B400000;  // the float 12582912 = 1.5·2^23 (ulp 1)
constexpr float kMagic = 12582912.0f;

// A quantised activation matrix [rows][K] (quant_rows_kernel's output, ops_moe_int_mma.cu): the
// tensor-core kernels' token operand.
struct APlanes {
  const uint8_t* hi;
  const uint8_t* lo;
  const float* sb;   // [rows][ceil(K/128)]
  const int2* sums;  // [rows][K/U]
};

// The Hopper form of the 32- and 64-slot tile lists (ops_moe_int_wgmma.cu: wgmma, sm_90a builds on
// sm_90 GPUs): the same operands, tiles and bits as int_mma's mid and large tilings, for units of
// 128 k and K a multiple of 128. int_wgmma_serves says whether this process and device run it (and
// set_moe_int_wgmma has not turned it off) for an activation matrix of `rows` x K (rows·K < 2^32:
// the kernel addresses a plane with 32-bit offsets); the launch computes out[slot, n] (gate_up: act
// = silu(g)·u, kMats 2; down: y, kMats 1) for the tiles of `tiles` (grid_tiles rows of CTAs; those
// past *tiles.num_tiles exit), tile_slots 32 or 64.
bool int_wgmma_serves(int U, int K, int N, long long rows);
void int_wgmma_launch(int kMats, int tile_slots, bool sym, const APlanes& a, int row_div,
                      const moe_detail::TileList& tiles, int grid_tiles, const moe_detail::ExpertView& w0,
                      const moe_detail::ExpertView& w1, float* out, cudaStream_t stream);

// Tensor-core (mma.sync s8/u8, m16n8k32) kernels for any M >= 1 (ops_moe_int_mma.cu): activation
// quantisation, routing + grouping, gate/up, act quantisation, down, combine.
size_t int_mma_workspace_bytes(const MoeShape& s, int max_tokens);
void int_mma(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
             void* workspace, size_t workspace_bytes, float* residual, const float* shared_out,
             const float* shared_gate_logit, cudaStream_t stream, cudaEvent_t shared_ready);

}  // namespace moeserve::cuda::moe_int_detail
