// What `moeserve convert` writes, decided from tensor names, dtypes and shapes alone (no data
// is read): which Linear modules are quantised into which format, how fused expert tensors are
// split, and every output tensor with its dtype and shape. Pure, so that `moeserve inspect
// --weights` can plan a conversion it does not run.
//
// A "Linear module" is a 2-D BF16/F16/F32 tensor "<module>.weight" of the text model other than
// the embedding table, or one expert of a fused experts tensor (spec 3.1/3.2):
//   <p>.mlp.experts.gate_up_proj [E, 2I, H] -> <p>.mlp.experts.{e}.gate_proj [I, H] (rows 0..I-1)
//                                              <p>.mlp.experts.{e}.up_proj   [I, H] (rows I..2I-1)
//   <p>.mlp.experts.down_proj    [E, H, I]  -> <p>.mlp.experts.{e}.down_proj [H, I]
// Modules are named canonically ("layers.0.mlp.experts.3.up_proj", "mtp.layers.0.self_attn.q_proj",
// "lm_head"); output tensors keep the stored prefix of their source.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/convert_source.h"

namespace moeserve::tools {

enum class WeightsMode { Keep, GptqInt4, Fp8Block, HybridInt4Fp8 };
// "keep" / "gptq-int4" / "fp8-block" / "hybrid-int4-fp8"; parse throws on anything else.
std::string_view weights_mode_name(WeightsMode mode);
WeightsMode parse_weights_mode(const std::string& text);

// What a Linear module is, by its canonical name (the default module sets are made of these).
enum class LinearRole {
  RoutedExpert,      // *.mlp.experts.{e}.{gate,up,down}_proj
  AttentionProj,     // *.self_attn.{q,k,v,o}_proj
  DeltaNetProj,      // *.linear_attn.{in_proj_qkv,in_proj_z,out_proj}
  DeltaNetGate,      // *.linear_attn.{in_proj_a,in_proj_b}
  SharedExpert,      // *.mlp.shared_expert.{gate,up,down}_proj
  SharedExpertGate,  // *.mlp.shared_expert_gate
  Router,            // *.mlp.gate
  LmHead,            // lm_head
  MtpFc,             // mtp.fc
  Other,
};
LinearRole linear_role(const std::string& canonical_module);

struct PlanOptions {
  WeightsMode mode = WeightsMode::Keep;
  // gptq-int4 / fp8-block only: quantise exactly the Linear modules whose canonical name this
  // ECMAScript regex matches somewhere (std::regex_search) instead of the default set.
  std::optional<std::string> modules_regex;
  int64_t group_size = 128;  // INT4 group along K
};

struct OutputTensor {
  std::string name;  // as written
  DType dtype;
  Shape shape;
  uint64_t nbytes() const { return uint64_t(shape_numel(shape)) * dtype_size(dtype); }
};

enum class QuantFormat { Dense, GptqInt4, Fp8Block };

// One unit of work: read one source range, write one or more output tensors.
struct PlanItem {
  enum class Action {
    Copy,      // the source bytes unchanged (a whole tensor, or one expert's rows of a fused one)
    GptqInt4,  // quantise an [N, K] slab -> qweight, qzeros, scales
    Fp8Block,  // quantise an [N, K] slab -> weight (F8_E4M3), weight_scale_inv (F32)
  };
  Action action = Action::Copy;
  const SourceTensor* source = nullptr;
  uint64_t source_offset = 0;  // bytes into the source tensor
  uint64_t source_bytes = 0;   // bytes read from there
  int64_t rows = 0, cols = 0;  // N, K of the slab (Linear items)
  std::string module;          // canonical module name (Linear items), for messages
  std::vector<OutputTensor> outputs;
};

struct ConvertPlan {
  std::vector<PlanItem> items;  // in source order
  // Stored module names (e.g. "model.layers.0.mlp.gate") of the Linear modules by final format,
  // in output order; what quantization_config lists.
  std::vector<std::string> int4_modules, fp8_modules, dense_modules;
  int64_t fused_tensors_split = 0;
  uint64_t source_bytes = 0;  // what executing the plan reads
  uint64_t output_bytes = 0;  // tensor bytes written
};

// Plans the conversion of `tensors` (which must outlive the plan). Errors, before anything is
// written: an invalid or empty-matching --modules regex, --modules with keep/hybrid, an INT4
// module whose K is not divisible by the group size (naming the module), two outputs with one name.
ConvertPlan plan_conversion(const std::vector<SourceTensor>& tensors, const PlanOptions& options);

}  // namespace moeserve::tools
