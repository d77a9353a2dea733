// Row-tiled matmuls on CUDA cores: Y[M, N] = X[M, K] · Wᵀ with W in GPTQ INT4, FP8
// block-128, INT8 row-wise or BF16 (Dense, and NVFP4 dequantised at load), dequantised in
// registers, fp32 accumulation, and a fixed reduction order per output: a row's result
// never depends on M or on the other rows (batch invariance), for any M (tiles of 16 rows).
// Roofline at decode (M <= 16): bytes(W) / bandwidth. For large M every row tile re-reads
// W (from L2 when the tiles of one weight slice run together) and the FMAs run on CUDA
// cores: this is the batch-invariant baseline, not the prefill kernel (docs/PERF.md).
#pragma once
#include <cuda_runtime.h>

#include <span>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda {

void quant_gemv(const bf16* x, int M, const DeviceLinear& w, void* y, bool y_f32, bool accumulate,
                cudaStream_t stream);
// The same with f32 activations (the model's path: x is not rounded to bf16).
void quant_gemv(const float* x, int M, const DeviceLinear& w, void* y, bool y_f32, bool accumulate,
                cudaStream_t stream);

// Several projections of the same f32 x (q/k/v, gate/up): y_i [M, N_i] f32 = x·W_iᵀ. Weights of
// one FP8 / INT8 / bf16 format and one K (K % 16 == 0), at most 4, run as ONE launch; each
// output is bit-identical to its own quant_gemv. Anything else runs as separate launches.
struct LinearOut {
  const DeviceLinear* w;
  float* y;
};
void quant_gemv_multi(const float* x, int M, std::span<const LinearOut> outs, cudaStream_t stream);

}  // namespace moeserve::cuda
