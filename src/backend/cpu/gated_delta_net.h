// Gated DeltaNet token mixing after the input projections (../shared/spec/qwen35_arch.md
// section 2.5 steps 2-9, up to but not including out_proj), fp32:
//   causal depthwise conv (kernel K, state = last K−1 pre-conv inputs) + SiLU,
//   split q | k | v, l2norm(q)/sqrt(dk), l2norm(k), β = sigmoid(b),
//   g = −exp(A_log)·softplus(α + dt_bias), the delta rule per value head (v head j reads
//   k head j / (nv/nk), repeat_interleave), then the gated RMSNorm with silu(z) per head.
#pragma once
#include <cstdint>
#include <span>

#include "core/thread_pool.h"

namespace moeserve::cpu {

struct GdnGeometry {
  int64_t num_k_heads = 0;  // nk
  int64_t num_v_heads = 0;  // nv
  int64_t k_head_dim = 0;   // dk
  int64_t v_head_dim = 0;   // dv
  int64_t conv_kernel = 4;  // K

  int64_t key_dim() const { return num_k_heads * k_head_dim; }
  int64_t value_dim() const { return num_v_heads * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t conv_state_size() const { return conv_dim() * (conv_kernel - 1); }
  int64_t recurrent_state_size() const { return num_v_heads * k_head_dim * v_head_dim; }
};

// One layer's parameters (fp32, owned by the model).
struct GdnParams {
  const float* conv_weight = nullptr;  // [conv_dim][K]; tap K−1 multiplies the current token
  const float* dt_bias = nullptr;      // [nv]
  const float* a_log = nullptr;        // [nv]
  const float* norm_weight = nullptr;  // [dv], shared by all heads
  float norm_eps = 1e-6f;
};

// One sequence's part of a step.
struct GdnChunk {
  int64_t num_tokens = 0;
  const float* qkv = nullptr;      // [T][conv_dim]: in_proj_qkv output, channels q | k | v
  const float* z = nullptr;        // [T][nv·dv]
  const float* b = nullptr;        // [T][nv]
  const float* a = nullptr;        // [T][nv]
  float* conv_state = nullptr;     // [conv_dim][K−1], oldest input first; updated
  float* recurrent_state = nullptr;// [nv][dk][dv]; updated
  float* out = nullptr;            // [T][nv·dv]: gated-norm output, the input of out_proj
};

enum class DeltaRuleMode {
  Auto,       // recurrent for a single token, chunked (64) for longer chunks, as HF does
  Recurrent,
  Chunked,
};

void gated_delta_net(ThreadPool& pool, const GdnGeometry& geo, const GdnParams& params,
                     std::span<const GdnChunk> chunks, DeltaRuleMode mode = DeltaRuleMode::Auto);

// Step 2 alone: ũ[t][c] = silu(Σ_j W[c][j] · u[t − (K−1) + j][c]) with earlier inputs taken from
// conv_state (then updated to the last K−1 inputs). Channels [c0, c1) only.
void causal_conv1d_silu(const float* u, int64_t num_tokens, int64_t channels, int64_t kernel,
                        const float* weight, float* conv_state, float* out, int64_t c0, int64_t c1);

}  // namespace moeserve::cpu
