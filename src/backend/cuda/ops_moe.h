// The sparse MoE block on the GPU (spec 2.7): router logits -> fp32 softmax -> top-k ->
// renormalise, all on the device with no host synchronisation; tokens grouped by expert so
// that each selected expert's weights are read once per step for all its tokens; gate and up
// projections with SiLU(gate)·up; down projection; routing-weighted sum in a fixed order
// (per token, in top-k rank order), added into the f32 residual. The shared expert and its
// sigmoid gate are computed by the model with the linear ops.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda {

// All routed experts of one layer, stacked so one launch can reach any expert. Every
// expert of a layer shares one format; each projection is its own DeviceLinear whose buffers
// hold the E experts back to back, each in the single-Linear layout of device_linear.h:
//   gate, up: N = I, K = H per expert;  down: N = H, K = I per expert.
//   Dense bf16 [E][N][K]; GPTQ qweight [E][K/8][N], scales f16 [E][K/g][N], qzeros [E][K/g][N/8]
//   (act-order: g_idx [E][K] int32, all experts of a layer or none); FP8 block e4m3
//   [E][N][K] with f32 scales [E][ceil(N/128)][ceil(K/128)]. NVFP4 experts are dequantised to
//   Dense bf16 at load. The DeviceLinear's N and K are the PER-EXPERT sizes.
struct DeviceExperts {
  quant::WeightFormat format = quant::WeightFormat::Dense;
  int num_experts = 0, hidden = 0, intermediate = 0, group_size = 0;
  bool sym = true;
  DeviceLinear gate, up, down;
};

// Stacks E per-expert host weights (all one format) into DeviceExperts.
DeviceExperts upload_experts(const std::vector<const quant::QuantWeight*>& gate,
                             const std::vector<const quant::QuantWeight*>& up,
                             const std::vector<const quant::QuantWeight*>& down, cudaStream_t stream);

struct MoeShape {
  int num_experts = 0;
  int top_k = 0;
  int hidden = 0;
  int intermediate = 0;
};

size_t moe_workspace_bytes(const MoeShape& shape, int max_tokens);

// x: bf16 [M, H] (post-attention-norm activations); router_logits: f32 [M, E] (computed by the
// caller with the linear ops). residual: f32 [M, H] += routed expert output.
// Launches: with GPTQ INT4 experts (no act-order, E <= 256) and M <= 8 two kernels (routing
// fused into gate/up, the combine into down; ops_moe_decode.cu), otherwise routing + grouping,
// gate/up, down and combine. Both give a token the same bits. The decode kernels are
// programmatic dependent launches (they wait for the preceding kernel before touching memory).
void moe_routed_experts(const bf16* x, const float* router_logits, const MoeShape& shape,
                        const DeviceExperts& experts, int M, void* workspace, size_t workspace_bytes,
                        float* residual, cudaStream_t stream);
// The same with f32 activations x [M, H] (the model's path).
// shared_out (optional, f32 [M, H]) and shared_gate_logit ([M]): the shared expert's output and
// gate logit, added in the same pass: residual = (residual + routed) + sigmoid(logit)·shared,
// bit-identical to adding the routed sum and then the gated shared output separately.
// shared_ready (optional): an event the stream waits for before the first kernel that reads
// shared_out / shared_gate_logit (the model computes the shared expert on a side stream while the
// routing and the gate/up projections run).
void moe_routed_experts(const float* x, const float* router_logits, const MoeShape& shape,
                        const DeviceExperts& experts, int M, void* workspace, size_t workspace_bytes,
                        float* residual, cudaStream_t stream, const float* shared_out = nullptr,
                        const float* shared_gate_logit = nullptr, cudaEvent_t shared_ready = nullptr);

// Steps of 9 .. max_tokens (set_moe_grouped_max_tokens, default 64) tokens with GPTQ INT4 experts
// (no act-order, gate and up of one group size and zero mode, x 16-byte aligned) run the grouped
// kernels (ops_moe_grouped.cu): routing + grouping into tiles of up to 4 slots of one expert,
// gate/up and down reading each tile's expert slice once for all its slots, and the combine. A
// token gets the same bits as through the tiled kernels they replace (and the decode kernels).
// The switches are read on the host at launch (a captured CUDA graph keeps the path it was
// captured with); they exist for A/B measurements and default to on, 64 tokens.
void set_moe_grouped_enabled(bool on);
void set_moe_grouped_max_tokens(int max_tokens);
// Whether moe_routed_experts would take the grouped kernels for this step (given an aligned x).
bool moe_grouped_serves(const MoeShape& shape, const DeviceExperts& experts, int M);
// The generated-token GPTQ expert kernels (M <= 8, ops_moe_decode.cu) that moe_routed_experts
// launches: 1 (default) the streaming kernels (cp.async ring, 32-column CTAs), 0 the previous
// kernels, for an A/B in one binary (bench flags); both give every output the same bits. Throws
// Error on other values. Takes effect at the next launch (a captured CUDA graph keeps the
// kernels it captured).
void set_moe_decode_variant(int variant);
int moe_decode_variant();
// The integer-form expert kernels for <= 8 tokens (`--expert-activations int16`, int_decode): 2
// (default) the streaming kernels (ops_moe_int_stream.cu: cp.async rings, a CTA per 32 columns of
// gate/up and 16 of down) with gate/up and down in one launch for a step of one token called
// without the shared expert (the caller adds it) where the device holds the whole grid at once;
// 1 the streaming kernels always as two launches; 0 the persistent ones (ops_moe_int_decode.cu),
// for an A/B in one binary; all give every output the same bits. Throws Error on other values;
// takes effect at the next launch (a captured CUDA graph keeps the kernels it captured).
void set_moe_int_decode_variant(int variant);
int moe_int_decode_variant();
// The streaming kernels' ring (ops_moe_int_stream.cu): at most this many steps of 2 rows in flight per
// thread. -1 (the default): 2 for steps of 2-8 tokens, the largest that fits for one token (docs/PERF.md
// run S24-7); 0: the largest that fits; N: at most N. Every ring gives the same bits. Read at launch time
// (a captured CUDA graph keeps the ring it was captured with). Throws Error below -1.
void set_moe_int_stream_ring_cap(int steps);
// Whether moe_routed_experts_int would run a step of M tokens on the streaming kernels.
bool moe_int_decode_streams(const MoeShape& shape, const DeviceExperts& experts, int M);
// Whether it would run a step of M tokens without the shared expert on the fused one-token kernel.
bool moe_int_decode_fuses(const MoeShape& shape, const DeviceExperts& experts, int M);

// Same contract as moe_routed_experts (f32 overload), expert GEMMs on tensor cores (mma.sync
// bf16, f32 activations split hi + lo; ops_moe_mma.cu). A token's result is bit-identical for any
// M and any other tokens in the launch (not equal to moe_routed_experts' bits). Returns false (and
// does nothing) when the experts' format is not supported (GPTQ act-order g_idx, a group other
// than 32/64/128, H or I not a multiple of 16, an x not 16-byte aligned, INT8 experts), so the
// caller falls back to moe_routed_experts. workspace: moe_mma_workspace_bytes(shape, >= M).
// Roofline: at 1K prompt tokens x top-8 nearly every expert is read once (122B-A10B: ~1.25 GB of
// INT4 experts per layer, ~0.3 ms at 4.3 TB/s) and the useful work is 155 GFLOP per layer; the
// tensor cores execute twice that (hi and lo MMAs), so prefill-sized steps are compute-bound.
bool moe_routed_experts_mma(const float* x, const float* router_logits, const MoeShape& shape,
                            const DeviceExperts& experts, int M, void* workspace, size_t workspace_bytes,
                            float* residual, cudaStream_t stream, const float* shared_out = nullptr,
                            const float* shared_gate_logit = nullptr);
size_t moe_mma_workspace_bytes(const MoeShape& shape, int max_tokens);  // M <= max_tokens (up to 2048+)
// The kernel form moe_routed_experts_mma launches (ops_moe_mma.cu; default 8, see below; bench flag
// --moe-mma-variant): 0, 1, 5, 7 or 8 (variants 2, 3, 4 and 6 were removed: they never won their
// measurements, docs/PERF.md runs T3-T8; the others keep the numbers PERF.md cites). 1: GPTQ nibble
// pairs converted with one PRMT + one LOP3 (+ a shift), and the 64-slot tiling's 8 warps 1 x 8 (each
// GPTQ / FP8 weight word converted once per CTA); 0: the previous kernels, for an A/B in one binary; 0
// and 1 give every output the same bits. 5: the GPTQ "word form": the activations' k permuted inside
// each 32-k block so that each MMA thread's B registers of two k16 steps come from one GPTQ weight
// word (1 load, 3 shifts, 4 LOP3, 4 HSUB2 per word; FP8 / bf16 experts run variant 1); batch
// invariant, but it differs from 0 and 1 by rounding (other products share an MMA); faster than 1 in
// run T6. 7: variant 5's kernels with the tile size chosen per EXPERT above 4 slots per expert on
// average (64-slot tiles, an expert's remainder of <= 32 slots on a 32-slot tile: one weight pass for
// an expert of 33-64 slots instead of two; two tile lists, four expert launches), variant 5's bits. 8
// (default): variant 7, except that GPTQ steps of <= 4 slots per expert on average (decode sizes: up
// to 128 tokens at E 256, top-8) run the swapAB kernels (ops_moe_mma_swap.cu: the weights as the MMA's
// A operand, tiles of <= 4 slots as its B operand, the activation split fused into gate_up, the
// combine into down; at <= 8 tokens the routing too, so two launches), variant 5's bits.
// set_moe_mma_variant throws Error on any other value (and keeps the current one).
// Read on the host at launch (a captured CUDA graph keeps the kernels it captured).
void set_moe_mma_variant(int variant);
int moe_mma_variant();
// The integer form of GPTQ INT4 experts (moe_int_arith.h): activations quantised to 16-bit integers per
// 128-k block, exact int32 sums per weight group (dp4a / s8-u8 mma.sync), one fixed f32 fold over the
// groups. Every kernel of the form gives a token the same bits, so one call serves any mix of prompt
// and generated tokens: steps of <= moe_int_decode_max_tokens() tokens take the CUDA-core dp4a kernels
// (routing fused into gate/up, the combine into down: two launches, ops_moe_int_decode.cu), larger ones
// the tensor-core kernels (ops_moe_int_mma.cu). Same contract as moe_routed_experts_mma otherwise
// (residual += routed, + the gated shared expert; shared_ready as in moe_routed_experts). Returns false
// (and does nothing) when the experts are not covered (moe_int_supported), so the caller falls back.
// workspace: moe_int_workspace_bytes(shape, >= M).
bool moe_int_supported(const MoeShape& shape, const DeviceExperts& experts);
size_t moe_int_workspace_bytes(const MoeShape& shape, int max_tokens);
bool moe_routed_experts_int(const float* x, const float* router_logits, const MoeShape& shape,
                            const DeviceExperts& experts, int M, void* workspace, size_t workspace_bytes,
                            float* residual, cudaStream_t stream, const float* shared_out = nullptr,
                            const float* shared_gate_logit = nullptr, cudaEvent_t shared_ready = nullptr);
// The largest step (tokens) that takes the dp4a kernels; 0 sends every step to the tensor-core kernels.
// Default 8, at most 8; both paths give the same bits (A/B and tests). Throws Error outside 0..8.
void set_moe_int_decode_max_tokens(int max_tokens);
int moe_int_decode_max_tokens();
// The tensor-core kernels' 32- and 64-slot tiles on Hopper warpgroup MMAs (wgmma; sm_90 GPUs, builds with
// sm_90a code, units of 128 k) instead of mma.sync, where available (default on); the same bits.
void set_moe_int_wgmma(bool on);
bool moe_int_wgmma();
// Opts the kernels of moe_routed_experts_mma in to their (> 48 KB) dynamic shared memory on the
// current device, so that a later first call may happen inside CUDA-graph capture (the first call
// does it too when this was not called). Call once per device at model construction, not inside
// capture.
void moe_mma_prepare();

}  // namespace moeserve::cuda
