// A Linear layer's weight on the GPU, in the format the checkpoint stores it (layouts in
// docs/CUDA_BACKEND.md), and the runner that computes Y[M, N] = X[M, K] · Wᵀ.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_buffer.h"
#include "quant/quant_weight.h"

namespace moeserve::cuda {

using bf16 = __nv_bfloat16;

struct DeviceLinear {
  quant::WeightFormat format = quant::WeightFormat::Dense;
  int64_t N = 0, K = 0;
  int64_t group_size = 0;   // GPTQ group along K
  bool sym = true;          // GPTQ: zero = 8 everywhere
  DeviceBuffer<bf16> dense;           // Dense (and NVFP4, dequantised at load): [N, K]
  DeviceBuffer<int32_t> qweight;      // GPTQ: [K/8, N], nibble j of word (k/8, n) = q[8(k/8)+j, n]
  DeviceBuffer<__half> scales;        // GPTQ: [K/g, N]
  DeviceBuffer<int32_t> qzeros;       // GPTQ: [K/g, N/8], stored zero - 1 (v1)
  DeviceBuffer<int32_t> g_idx;        // GPTQ act-order: [K] group of each k (empty: k / g)
  DeviceBuffer<uint8_t> fp8;          // FP8 block: e4m3 [N, K]
  DeviceBuffer<float> scale;          // FP8 block: [ceil(N/128), ceil(K/128)]; INT8: [N] row scales
  DeviceBuffer<int8_t> int8;          // INT8 row-wise: [N, K]

  size_t bytes() const {
    return dense.bytes() + qweight.bytes() + scales.bytes() + qzeros.bytes() + g_idx.bytes() + fp8.bytes() +
           scale.bytes() + int8.bytes();
  }
};

// Copies a host QuantWeight to the GPU in its own format (NVFP4 is dequantised to bf16;
// F32/F16 dense weights are rounded to bf16).
DeviceLinear upload_linear(const quant::QuantWeight& w, cudaStream_t stream);
// Quantises a dense weight to INT8 row-wise at load with quant::quantize_int8_rowwise
// (scale[n] = max|W[n,:]| / 127, halves away from zero; the seed's INT8 LM head).
DeviceLinear upload_linear_int8_rowwise(const quant::QuantWeight& w, cudaStream_t stream);

}  // namespace moeserve::cuda
