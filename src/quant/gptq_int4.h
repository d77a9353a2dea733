// GPTQ / AutoRound INT4 (quant_method "gptq" or "auto-round" with packing
// "auto_round:auto_gptq"; ../shared/spec/qwen35_arch.md section 4.1), with K = in_features,
// N = out_features, g = group size, G = K / g:
//
//   qweight  I32 [K/8, N]  eight 4-bit codes along K per word, low nibble first:
//                          q[k, n] = (qweight[k/8, n] >> 4·(k%8)) & 0xF
//   qzeros   I32 [G, N/8]  eight zero points along N per word, stored as zero − 1 (GPTQ "v1"):
//                          zero[j, n] = ((qzeros[j, n/8] >> 4·(n%8)) & 0xF) + 1
//   scales   F16 [G, N]
//   g_idx    I32 [K]       optional (act-order / desc_act): the group of input row k;
//                          without it the group of k is k / g
//
//   W[n, k] = float(q[k, n] − zero[j, n]) · float(scales[j, n]),   j = g_idx[k] or k / g
//
// Symmetric weights (sym = true) use zero = 8 everywhere (vLLM's uint4b8 kernels do not read
// qzeros); qzeros may then be absent, and if present must hold 8 (stored nibble 7, words
// 0x77777777): anything else means the config and the tensors disagree.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "quant/part_labels.h"
#include "quant/quant_weight.h"

namespace moeserve::quant {

struct GptqInt4Params {
  int64_t group_size = 128;  // -1: one group over all of K (per-channel)
  bool sym = true;
};

// Validates shapes, dtypes, the group size and g_idx, and returns the weight (views, no
// copy). `qzeros` and `g_idx` may be undefined Tensors (absent). Errors name the tensor.
QuantWeight gptq_int4_weight(std::string name, int64_t out_features, int64_t in_features,
                             const GptqInt4Params& params, Tensor qweight, Tensor qzeros, Tensor scales,
                             Tensor g_idx, const PartLabels& labels);

// Rows [row_begin, row_end) of W in fp32 (QuantWeight::dequantize_rows for GptqInt4).
void dequantize_gptq_int4_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* out);

}  // namespace moeserve::quant
