// NVFP4: 4-bit E2M1 values in groups of 16 along K, one F8_E4M3 scale per group and one F32
// scale per tensor (../shared/spec/qwen35_arch.md section 4.3). Two published flavours:
//
// compressed-tensors (quant_method "compressed-tensors", format "nvfp4-pack-quantized"):
//   weight_packed        U8 [N, K/2]        two codes per byte, low nibble = even k
//   weight_scale         F8_E4M3 [N, K/16]
//   weight_global_scale  F32 [1]            (a divisor)
//   W[n, k] = e2m1(code[n, k]) · (float(weight_scale[n, k/16]) / weight_global_scale)
//
// ModelOpt (quant_method "modelopt", quant_algo "NVFP4"):
//   weight               U8 [N, K/2]        same packing
//   weight_scale         F8_E4M3 [N, K/16]
//   weight_scale_2       F32 [] or [1]      (a multiplier; = 1 / weight_global_scale)
//   W[n, k] = e2m1(code[n, k]) · (float(weight_scale[n, k/16]) · weight_scale_2)
//
// The per-group factor in parentheses is formed first, in fp32, exactly as the quantisers
// and the reference dequantisers do; dividing by the global scale is kept a division so the
// result is bit-exact. E2M1: bit 3 is the sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
// Activation scales (input_global_scale, input_scale) belong to W4A4 kernels; this
// dequantised path keeps activations in full precision and does not read them.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "quant/part_labels.h"
#include "quant/quant_weight.h"

namespace moeserve::quant {

enum class Nvfp4Flavour { CompressedTensors, ModelOpt };

// Validates and returns the weight (views, no copy). `tensor_scale` is weight_global_scale
// (compressed-tensors; stored as part "global_scale") or weight_scale_2 (ModelOpt; part
// "weight_scale_2"). Errors name the tensor.
QuantWeight nvfp4_weight(std::string name, int64_t out_features, int64_t in_features, Nvfp4Flavour flavour,
                         Tensor packed, Tensor group_scale, Tensor tensor_scale, const PartLabels& labels);

// Rows [row_begin, row_end) of W in fp32 (QuantWeight::dequantize_rows for Nvfp4).
void dequantize_nvfp4_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* out);

// The E2M1 value of a 4-bit code (code 8 is −0).
float e2m1_to_f32(uint8_t code);

}  // namespace moeserve::quant
