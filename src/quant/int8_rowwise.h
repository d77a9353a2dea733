// INT8 row-wise weights: the LM head quantised at load (--int8-lm-head), never read from a
// checkpoint.
//
//   weight      I8 [N, K]
//   row_scales  F32 [N]
//   W[n, k] = float(weight[n, k]) · row_scales[n]
//
// Quantisation of row n of a weight W (any format, through its exact dequantisation):
//   amax  = max_k |W[n, k]|
//   scale = amax / 127          (1 when the row is all zeros, so that nothing divides by 0)
//   q     = round_half_away_from_zero(W[n, k] / scale), clamped to [-127, 127]
// (symmetric: -128 is never used). Both divisions and the rounding are fp32 / std::round.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "quant/part_labels.h"
#include "quant/quant_weight.h"

namespace moeserve::quant {

// Quantises `w` row by row as above; the result owns its tensors and is named like `w`.
QuantWeight quantize_int8_rowwise(const QuantWeight& w);

// Wraps existing tensors (validated: I8 [N, K], F32 [N]).
QuantWeight int8_rowwise_weight(std::string name, Tensor weight, Tensor row_scales, const PartLabels& labels);

// Rows [row_begin, row_end) of W in fp32 (QuantWeight::dequantize_rows for Int8Rowwise).
void dequantize_int8_rowwise_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* out);

}  // namespace moeserve::quant
