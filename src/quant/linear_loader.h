// Loading one Linear layer's weight from a checkpoint, whatever format it is stored in.
#pragma once
#include <cstdint>
#include <string>

#include "io/checkpoint.h"
#include "io/qwen35_config.h"
#include "quant/quant_weight.h"

namespace moeserve::quant {

// The weight of Linear `module` (canonical name without suffix, e.g.
// "layers.0.self_attn.q_proj") as W [out_features, in_features].
//
// THE extension point for weight formats: today it reads the dense `<module>.weight`
// (BF16/F16/F32) and checks its shape. Quantised formats are detected here from the tensors
// the checkpoint holds for this module (spec section 4: `.qweight` -> GPTQ/AutoRound INT4,
// F8_E4M3 `.weight` + `.weight_scale_inv` -> FP8 block, `.weight_packed` / `.weight_scale_2`
// -> NVFP4), so callers never need to know the format. Errors name the file and tensor.
QuantWeight load_linear(const io::Checkpoint& ckpt, const std::string& module, int64_t out_features,
                        int64_t in_features, const io::Qwen35Config& config);

}  // namespace moeserve::quant
