// QuantWeight: one Linear layer's weight W [out_features N, in_features K] in whatever
// format the checkpoint stores it, and its exact dequantisation to fp32.
//
// The format is decided per tensor from what the checkpoint holds (docs/FORMATS.md,
// ../shared/spec/qwen35_arch.md section 4), so a hybrid checkpoint needs no mode flag:
//   Dense        <name>.weight in BF16/F16/F32                  W = weight
//   GptqInt4     <name>.qweight [K/8,N] i32, .qzeros, .scales    W[n,k] = (q - zero) * scale
//   Fp8Block     <name>.weight F8_E4M3 [N,K] + .weight_scale_inv W[n,k] = fp8 * s[n/128,k/128]
//   Nvfp4        .weight_packed/.weight_scale/(.weight_global_scale | .weight_scale_2)
//   Int8Rowwise  int8 [N,K] + per-row scales (LM head, quantised at load)
// Each format's tensors, shapes and formula: its own header (gptq_int4.h, fp8_block.h,
// nvfp4.h, int8_rowwise.h) and docs/FORMATS.md.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"

namespace moeserve::quant {

enum class WeightFormat { Dense, GptqInt4, Fp8Block, Nvfp4, Int8Rowwise };
std::string_view format_name(WeightFormat f);

struct QuantWeight {
  WeightFormat format = WeightFormat::Dense;
  int64_t out_features = 0;  // N (rows of W)
  int64_t in_features = 0;   // K (columns of W)
  int64_t group_size = 0;    // GPTQ / NVFP4 group along K; FP8 block edge along K (128)
  bool sym = true;           // GPTQ symmetric (zero = 8)
  // The stored tensors by role, per format:
  //   Dense        "weight" (BF16/F16/F32 [N, K])
  //   GptqInt4     "qweight", "scales", optional "qzeros" (absent only when sym), optional "g_idx"
  //   Fp8Block     "weight" (F8_E4M3 [N, K]), "weight_scale_inv"
  //   Nvfp4        "weight_packed" (U8 [N, K/2]), "weight_scale" (F8_E4M3 [N, K/16]), and either
  //                "global_scale" (compressed-tensors: divide by it) or "weight_scale_2"
  //                (ModelOpt: multiply by it), F32 with one element
  //   Int8Rowwise  "weight" (I8 [N, K]), "row_scales" (F32 [N])
  std::map<std::string, Tensor> parts;
  std::string name;  // the module name in the checkpoint, for error messages
  int64_t block_rows = 0;    // FP8 block edge along N (128); 0 elsewhere

  const Tensor& part(const std::string& role) const;
  bool has_part(const std::string& role) const { return parts.count(role) != 0; }

  // Writes rows [row_begin, row_end) of W as fp32 into out[(r - row_begin) * K + k].
  // Exact: equals the published dequantisation formula evaluated in fp32.
  void dequantize_rows(int64_t row_begin, int64_t row_end, float* out) const;

  // Bytes this weight occupies as stored (what a kernel streams per full read): the sum of
  // its parts. Tensors the checkpoint holds beside them that the weight does not use
  // (NVFP4 input scales) are not counted.
  size_t stored_bytes() const;
};

// A dense QuantWeight over a [N, K] tensor view (no copy).
QuantWeight dense_weight(Tensor w, std::string name);

}  // namespace moeserve::quant
