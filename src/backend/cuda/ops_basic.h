// Small memory-bound kernels of the step: embedding, residual add + (1+w) RMSNorm, SwiGLU,
// argmax. Layouts in docs/CUDA_BACKEND.md. Each is one pass over its inputs; rooflines are
// bytes / bandwidth and these are a few percent of a decode step.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeserve::cuda {

using bf16 = __nv_bfloat16;

// out[m, :] = float(table[ids[m], :]) for m < M. table: bf16 [V, H].
void embedding_lookup(const int32_t* ids, int M, const bf16* table, int H, float* out, cudaStream_t stream);

// residual[m] += delta[m] (delta f32, may be null), then
// out[m] = bf16( residual[m] * rsqrt(mean(residual[m]^2) + eps) * (1 + w) )   (spec 2.1.1)
// (out may be null) and, when out_f32 is given, the same row unrounded (the input of the f32-activation
// projections: router and DeltaNet gates, see ops_small_linear.h).
void add_rms_norm(float* residual, const float* delta, const float* w, int M, int H, float eps, bf16* out,
                  cudaStream_t stream, float* out_f32 = nullptr);
// A gated add of rows before the norm: residual[m] = fmaf(sigmoid(gate_logit[m]), values[m], residual[m])
// (after delta, if given), sigmoid = 1 / (1 + __expf(−g)): the MoE combine's last step (ops_moe.h: residual
// + routed, then + sigmoid(gate)·shared), so the model may add the shared expert here, after the routed
// experts' kernels, with the same bits. values [M, H] f32, gate_logit [M].
struct GatedAdd {
  const float* values = nullptr;
  const float* gate_logit = nullptr;
};
void add_rms_norm(float* residual, const float* delta, GatedAdd gated, const float* w, int M, int H, float eps,
                  bf16* out, cudaStream_t stream, float* out_f32 = nullptr);

// act[m, i] = bf16( silu(gu[m, i]) * gu[m, I + i] ) for the fused [gate | up] output gu [M, 2I].
void silu_mul(const bf16* gate_up, int M, int I, bf16* act, cudaStream_t stream);

// act[m, i] = bf16( silu(g[m, i]) * u[m, i] ), g and u bf16 [M, I] (separate projections).
void silu_mul_split(const bf16* g, const bf16* u, int M, int I, bf16* act, cudaStream_t stream);
void silu_mul_split(const float* g, const float* u, int M, int I, float* act, cudaStream_t stream);

// dst[r, :] = src[rows[r], :] for r < R; src, dst bf16 rows of H.
void gather_rows(const bf16* src, const int32_t* rows, int R, int H, bf16* dst, cudaStream_t stream);
void gather_rows(const float* src, const int32_t* rows, int R, int H, float* dst, cudaStream_t stream);

// residual[m, :] += scale(m) * x[m, :] where scale(m) = sigmoid(gate_logit[m]) (shared expert),
// x f32 [M, H], gate_logit f32 [M] (null: scale 1).
void add_scaled_rows(float* residual, const float* x, const float* gate_logit, int M, int H, cudaStream_t stream);

// out[r] = argmax_v logits[r, v] (first index on ties, as torch.argmax), logits f32 [R, V].
void argmax_rows(const float* logits, int R, int V, int32_t* out, cudaStream_t stream);

}  // namespace moeserve::cuda
