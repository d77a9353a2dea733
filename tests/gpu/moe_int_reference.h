// CPU reference of the integer form of the GPTQ INT4 routed experts (src/backend/cuda/
// moe_int_arith.h), for the GPU tests of moe_routed_experts_int and its kernels.
//   int_form_linear: steps 1-3 of moe_int_arith.h for one GPTQ weight (no act-order): the same
//     bits as any kernel of the form computes for that projection (exact integer unit sums, one
//     f32 fold).
//   int_form_moe: the routed block (routing as cpu::route_top_k, silu(g)·u, the combine), with
//     std::exp for silu and the shared gate's sigmoid, so it agrees with the GPU within a few ulps of
//     those (and, rarely, a rounding tie of an act row's quantisation), not bit for bit.
#pragma once
#include <vector>

#include "quant/quant_weight.h"

namespace moeserve::gputest {

// y [M, N] = W x in the integer form; x [M, K] row-major f32, W GPTQ INT4 [N, K] (K % 128 == 0).
std::vector<float> int_form_linear(const quant::QuantWeight& w, const float* x, int M);

struct IntFormExperts {
  std::vector<const quant::QuantWeight*> gate, up, down;  // E each: gate/up [I, H], down [H, I]
};

// residual [M, H] (in/out) += routed expert output of x [M, H] (router logits [M, E]); then, when
// shared_out ([M, H]) is given, + sigmoid(shared_gate_logit[m])·shared_out[m] (the combine's steps).
void int_form_moe(const IntFormExperts& ex, int top_k, const float* x, const float* logits, int M, float* residual,
                  const float* shared_out = nullptr, const float* shared_gate_logit = nullptr);

}  // namespace moeserve::gputest
