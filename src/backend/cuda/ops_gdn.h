// Gated DeltaNet on the GPU (spec 2.5), for decode steps and prefill chunks in one launch:
// causal depthwise conv + SiLU with the per-slot conv state, beta = sigmoid(b),
// g = -exp(A_log)·softplus(a + dt_bias), l2norm(q)/sqrt(dk) and l2norm(k), the delta-rule
// recurrence on the fp32 state S [dk, dv] per v-head (v-head j uses k-head j / (nv/nk)),
// then the gated RMSNorm (plain w, silu(z)) per head. States live in slots (one per
// running sequence) and are updated in place. Every sequence of the step walks its new
// tokens with the recurrent rule (the state stays on chip across them), so a token's output
// is bit-identical whatever else shares the launch and however a prefill is chunked.
// Decode steps (one new token per sequence) run as one kernel whose CTAs split a head's dv
// columns (a key head's v-heads form a thread-block cluster for the gated norm): the state is
// read and written once, 2·nv·dk·dv·4 B per sequence (8.4 MB at the 122B shape), spread over
// the SMs; other steps run a prep kernel then the recurrence. Both give the same bits.
// Supported: dk <= 256, conv kernel 2..8, nv a multiple of nk.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/step_meta.h"

namespace moeserve::cuda {

using bf16 = __nv_bfloat16;

struct GdnShape {
  int num_k_heads = 0;   // nk
  int num_v_heads = 0;   // nv
  int k_head_dim = 0;    // dk
  int v_head_dim = 0;    // dv
  int conv_kernel = 4;   // K
  float norm_eps = 1e-6f;
  __host__ __device__ int key_dim() const { return num_k_heads * k_head_dim; }
  __host__ __device__ int value_dim() const { return num_v_heads * v_head_dim; }
  __host__ __device__ int conv_dim() const { return 2 * key_dim() + value_dim(); }
};

struct GdnLayerParams {
  const float* conv_weight = nullptr;  // [conv_dim][K], tap K-1 multiplies the current token
  const float* dt_bias = nullptr;      // [nv]
  const float* a_log = nullptr;        // [nv]
  const float* norm_weight = nullptr;  // [dv]
  float* conv_state = nullptr;         // [num_slots][conv_dim][K-1] for this layer, oldest first
  float* recurrent_state = nullptr;    // [num_slots][nv][dk][dv] for this layer
};

// Scratch for a step of up to max_tokens tokens: the conv output with normalised q/k, the
// gates, q̂·k̂ per key head and the raw delta-rule output (f32):
// max_tokens · (conv_dim + 2·nv + nk + nv·dv) floats, each part rounded up to 64 floats.
// The workspace must be 16-B aligned.
size_t gdn_workspace_bytes(const GdnShape& shape, int max_tokens);

// qkv: bf16 [M, conv_dim] (in_proj_qkv output, channels q | k | v); z: bf16 [M, nv·dv];
// b, a: f32 [M, nv] (in_proj_b / in_proj_a outputs, kept in f32: they set the gates).
// out: bf16 [M, nv·dv], the input of out_proj.
void gated_delta_net(const bf16* qkv, const bf16* z, const float* b, const float* a, const GdnShape& shape,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     bf16* out, cudaStream_t stream);
// The same with f32 activations (the model's path).
void gated_delta_net(const float* qkv, const float* z, const float* b, const float* a, const GdnShape& shape,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     float* out, cudaStream_t stream);

// Which kernels run a step. Auto (the two entry points above): a step whose sequences all
// have one new token (M == num_seqs, decode and graph padding) runs as ONE launch
// (gdn_decode_kernel: conv, gates, l2norm, the delta rule and the gated norm, a key head's
// v-heads in one thread-block cluster) when gdn_decode_kernel_supported(shape); any other
// step runs the prep kernel and the recurrence (+ norm); Auto takes the decode kernel only when
// its grid is about one wave (small batches), Decode whenever the step is decode-like. TwoPass
// always takes the prep + recurrence path (tests compare them bit for bit; benchmarks time
// them). All give the same bits.
enum class GdnKernels { Auto, Decode, TwoPass };
void gated_delta_net(const bf16* qkv, const bf16* z, const float* b, const float* a, const GdnShape& shape,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     bf16* out, cudaStream_t stream, GdnKernels kernels);
void gated_delta_net(const float* qkv, const float* z, const float* b, const float* a, const GdnShape& shape,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     float* out, cudaStream_t stream, GdnKernels kernels);
// True when a one-token-per-sequence step of this shape takes the one-launch decode kernel
// (f32 activations) on the current device: nv/nk <= 8, the CTA of a head part fits (dk,
// dv <= 256, at most 512 threads) and the device can hold one of its clusters.
bool gdn_decode_kernel_supported(const GdnShape& shape);

}  // namespace moeserve::cuda
