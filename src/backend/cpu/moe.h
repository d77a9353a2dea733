// The sparse MoE block of Qwen3.5 (../shared/spec/qwen35_arch.md section 2.7), fp32:
//   p = softmax(router · m) → top-k → renormalise;
//   routed = Σ_r w_r · Wd_e (silu(Wg_e m) ⊙ Wu_e m);
//   out = routed + sigmoid(w_sg · m) · shared_expert(m).
// Tokens are grouped per expert so that each selected expert's weights are dequantised once
// per step for all of its tokens. The routed sum runs in increasing expert order (as HF's
// index_add_ loop), independent of threads.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "quant/quant_weight.h"

namespace moeserve::cpu {

struct ExpertWeights {
  const quant::QuantWeight* gate = nullptr;  // [I, H]
  const quant::QuantWeight* up = nullptr;    // [I, H]
  const quant::QuantWeight* down = nullptr;  // [H, I]
};

struct MoeParams {
  const quant::QuantWeight* router = nullptr;       // [E, H]
  std::span<const ExpertWeights> experts;           // E routed experts
  ExpertWeights shared;                             // the shared expert
  const quant::QuantWeight* shared_gate = nullptr;  // [1, H]
  int64_t top_k = 0;
};

// Routing of one token: softmax over `logits` [E] in fp32, the top_k largest probabilities
// (ties: lower expert id first), renormalised to sum to 1. Writes top_k ids and weights.
void route_top_k(const float* logits, int64_t num_experts, int64_t top_k, int32_t* ids, float* weights);

// out[M, H] = MoE(x[M, H]).
void moe_forward(ThreadPool& pool, const MoeParams& params, const float* x, int64_t m, float* out);

}  // namespace moeserve::cpu
