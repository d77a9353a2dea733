// Fused dequantising matmuls for small M (decode): Y[M, N] = X[M, K] · Wᵀ with W in GPTQ
// INT4, FP8 block-128 or INT8 row-wise, dequantised in registers, fp32 accumulation, and a
// fixed reduction order (results do not depend on the batch a row shares).
// Roofline: bytes(W) / bandwidth, since M <= 16 rows of X are re-read from L1/L2.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda {

void quant_gemv(const bf16* x, int M, const DeviceLinear& w, void* y, bool y_f32, bool accumulate,
                cudaStream_t stream);

}  // namespace moeserve::cuda
