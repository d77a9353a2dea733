// FP8 block-scaled weights (quant_method "fp8", weight_block_size [bn, bk], Qwen's official FP8
// releases use [128, 128]; ../shared/spec/qwen35_arch.md section 4.2):
//
//   weight            F8_E4M3 [N, K]
//   weight_scale_inv  BF16/F16/F32 [ceil(N/bn), ceil(K/bk)]   one scale per bn×bk block;
//                     edge blocks may be partial
//
//   W[n, k] = float(weight[n, k]) · float(weight_scale_inv[n / bn, k / bk])
//
// "inv" is only a name: the stored value is the multiplier (the quantiser divided by it).
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "quant/part_labels.h"
#include "quant/quant_weight.h"

namespace moeserve::quant {

struct Fp8BlockShape {
  int64_t rows = 128;  // bn: rows of W (output features) per scale block
  int64_t cols = 128;  // bk: columns of W (input features) per scale block
};

// Validates dtypes and the scale grid and returns the weight (views, no copy). The result has
// group_size = bk and block_rows = bn.
QuantWeight fp8_block_weight(std::string name, int64_t out_features, int64_t in_features, const Fp8BlockShape& block,
                             Tensor weight, Tensor weight_scale_inv, const PartLabels& labels);

// Rows [row_begin, row_end) of W in fp32 (QuantWeight::dequantize_rows for Fp8Block).
void dequantize_fp8_block_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* out);

}  // namespace moeserve::quant
