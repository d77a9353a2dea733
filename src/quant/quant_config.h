// What a checkpoint's quantization_config (config.json) says about each Linear module
// (../shared/spec/qwen35_arch.md section 4; docs/FORMATS.md).
//
// The FORMAT of a module is decided by the tensors the checkpoint holds (linear_loader.h), so
// a hybrid checkpoint (INT4 experts + FP8 dense) needs no flag. The config adds what the
// tensors alone do not say, and the scheme checks the config itself:
//   - quant_method must be one this build decodes: auto-round, gptq, fp8, compressed-tensors
//     (format nvfp4-pack-quantized), modelopt (quant_algo NVFP4); anything else is an error;
//   - INT4 group size and symmetry, with AutoRound's per-module `extra_config` overrides
//     (exact module name, or a regex searched in the name as vLLM does);
//   - the FP8 block shape (weight_block_size, default [128, 128]);
//   - which modules the config declares unquantised (extra_config bits 16,
//     modules_to_not_convert, compressed-tensors `ignore`, ModelOpt `exclude_modules`), so that
//     a module stored quantised against its config is reported instead of silently loaded.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "io/qwen35_config.h"
#include "quant/fp8_block.h"
#include "quant/gptq_int4.h"

namespace moeserve::quant {

enum class QuantMethod { None, AutoRound, Gptq, Fp8, CompressedTensors, ModelOpt };
std::string_view quant_method_name(QuantMethod m);  // "none", "auto-round", ...

// The names a config entry may use for one module.
struct ModuleNames {
  std::string canonical;  // "layers.0.mlp.experts.3.up_proj"
  std::string stored;     // as on disk: "model.language_model.layers.0.mlp.experts.3.up_proj"
};

// NVFP4 groups are 16 elements along K (one F8_E4M3 scale each) in both published flavours.
inline constexpr int64_t kNvfp4GroupSize = 16;

class QuantScheme {
 public:
  // No quantization_config: formats still come from the tensors; INT4 parameters are then
  // inferred from the tensors (see int4_params) and FP8 blocks are 128x128.
  QuantScheme() = default;
  // Validates the method and its fields. `source` names the file in messages (config.json).
  QuantScheme(const std::optional<io::QuantizationConfig>& config, const std::string& source);

  QuantMethod method() const { return method_; }
  bool has_config() const { return method_ != QuantMethod::None; }
  // "config.json: quantization_config (quant_method 'fp8')", for messages.
  std::string describe() const;

  // INT4 group size and symmetry of a module stored as qweight, with AutoRound extra_config
  // overrides applied; nullopt when the config is not an INT4 one (no config, or an FP8 config
  // over a hybrid checkpoint): the loader then reads them from the tensors. Throws when the
  // config gives the module a bit width other than 4.
  std::optional<GptqInt4Params> int4_params(const ModuleNames& module) const;
  Fp8BlockShape fp8_block() const { return fp8_block_; }

  // The config entry that declares this module unquantised, e.g.
  // "extra_config 'model.layers.0.mlp.shared_expert_gate' (bits 16)" or "ignore 're:.*mlp.gate$'";
  // nullopt when the config quantises it (or says nothing).
  std::optional<std::string> excluded_by(const ModuleNames& module) const;

 private:
  struct Int4Override {  // one extra_config entry
    std::string key;
    std::optional<int> bits;
    std::optional<int64_t> group_size;
    std::optional<bool> sym;
  };
  struct Pattern {  // one entry of a list of unquantised modules
    std::string text;
    std::optional<std::regex> regex;  // when the entry is a pattern rather than a name
  };

  void parse_extra_config(const nlohmann::json& extra, const std::string& source);
  void parse_exclusions(const io::QuantizationConfig& q);
  const Int4Override* override_for(const ModuleNames& module) const;
  bool matches_exclusion(const Pattern& p, const std::string& name) const;

  QuantMethod method_ = QuantMethod::None;
  std::string source_;
  std::string exclusion_field_;  // "modules_to_not_convert", "ignore", "exclude_modules"
  int bits_ = 4;
  GptqInt4Params int4_;
  Fp8BlockShape fp8_block_;
  std::map<std::string, Int4Override> exact_overrides_;  // by canonical module name
  std::vector<std::pair<Int4Override, std::regex>> regex_overrides_;
  std::vector<Pattern> exclusions_;
};

}  // namespace moeserve::quant
