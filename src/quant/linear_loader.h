// Loading one Linear layer's weight from a checkpoint, whatever format it is stored in.
#pragma once
#include <cstdint>
#include <string>

#include "io/checkpoint.h"
#include "io/qwen35_config.h"
#include "quant/quant_config.h"
#include "quant/quant_weight.h"

namespace moeserve::quant {

// THE format detection point (docs/FORMATS.md, ../shared/spec/qwen35_arch.md section 4). The
// format of module M is decided per module by the tensors the checkpoint holds, so hybrid
// checkpoints (INT4 experts + FP8 dense layers) need no flag:
//   M.qweight present                      -> GPTQ / AutoRound INT4 (M.scales, M.qzeros, M.g_idx)
//   M.weight_packed present                -> NVFP4, compressed-tensors flavour
//   M.weight F8_E4M3                       -> FP8 block (M.weight_scale_inv)
//   M.weight U8                            -> NVFP4, ModelOpt flavour (M.weight_scale, M.weight_scale_2)
//   M.weight BF16/F16/F32                  -> dense
// The quantization_config adds INT4 group sizes (per-module overrides), the FP8 block shape,
// and the modules it declares unquantised: a module stored quantised against that is an error.
// Every error names the checkpoint directory, the tensor and the file it is in.
class LinearLoader {
 public:
  // Parses and validates config.quantization (an unknown quant_method throws here).
  LinearLoader(const io::Checkpoint& ckpt, const io::Qwen35Config& config);

  // The weight of Linear `module` (canonical name without suffix, e.g.
  // "layers.0.self_attn.q_proj") as W [out_features, in_features]. Views into the checkpoint's
  // mapping, no copy.
  QuantWeight load(const std::string& module, int64_t out_features, int64_t in_features) const;

  const QuantScheme& scheme() const { return scheme_; }

 private:
  struct Context;
  QuantWeight load_gptq(const Context& c) const;
  QuantWeight load_fp8(const Context& c) const;
  QuantWeight load_nvfp4(const Context& c, bool modelopt) const;
  QuantWeight load_dense(const Context& c) const;

  const io::Checkpoint& ckpt_;
  QuantScheme scheme_;
};

// One-off form of LinearLoader(ckpt, config).load(module, out_features, in_features). Loading
// a whole model, keep one LinearLoader: it parses the quantization_config (regexes) once.
QuantWeight load_linear(const io::Checkpoint& ckpt, const std::string& module, int64_t out_features,
                        int64_t in_features, const io::Qwen35Config& config);

}  // namespace moeserve::quant
