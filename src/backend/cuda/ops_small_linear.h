// Projections with few outputs whose results steer discrete or exponential choices: the MoE
// router (top-k of E logits), the DeltaNet gate projections in_proj_b / in_proj_a (beta and
// the decay exp(g)) and the shared expert's sigmoid gate. They read the UNROUNDED f32
// normalised activations (add_rms_norm's out_f32) instead of the bf16 copy the large GEMMs
// use, so bf16 rounding of x does not flip expert choices; the weight stays in its stored
// bf16. These are a small share of a step's bytes (E·H + 2·nv·H + H weights per layer).
//
// Layout: x f32 [M, K] row-major; W bf16 [N, K] row-major (Dense DeviceLinear); y f32 [M, N].
// They run row_gemv_f32 (ops_quant_gemv.h): each y[m, n] is summed in one fixed order that
// depends on K only, whatever M is, so a row's result never depends on its batch, and is the
// same as in a mixed-format row_gemv_f32 launch with other projections of the same x.
// Roofline: N·K·2 bytes of weight per call.
#pragma once
#include <cuda_runtime.h>

#include <span>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda {

// True when `w` can take the f32-activation path (a dense bf16 weight with K % 8 == 0).
bool small_linear_supported(const DeviceLinear& w);

// y[m, n] = sum_k x[m, k] · W[n, k]  (f32 accumulate).
void linear_f32_input(const float* x, int M, const DeviceLinear& w, float* y, cudaStream_t stream);

// Several such projections of the same x in one launch when they share K: the router with the
// shared-expert gate, in_proj_b with in_proj_a. Bit-identical to separate linear_f32_input calls.
struct SmallLinearOut {
  const DeviceLinear* w;
  float* y;
};
void linear_f32_input_multi(const float* x, int M, std::span<const SmallLinearOut> outs, cudaStream_t stream);

}  // namespace moeserve::cuda
