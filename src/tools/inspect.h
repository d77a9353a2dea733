// `moeserve inspect MODEL_DIR`: what a checkpoint holds and what decoding it costs.
//   - the architecture from config.json (layers and their types, heads, experts, dims);
//   - every weight grouped by kind (embedding, attention, deltanet, router, routed experts,
//     shared expert, norms, lm_head, mtp) with its storage format and bytes on disk;
//   - the bytes read per decoded token at batch size 1: routed experts scaled by
//     top-k / num_experts, the embedding as one row, everything else read fully once
//     (the KV cache and the GDN state are not included);
//   - optionally for a checkpoint that does not exist yet: `--weights FORMAT` plans the
//     conversion `moeserve convert --weights FORMAT` would write (tools/convert_plan.h) and
//     reports its weights; `--config-only` starts from config.json alone (the official BF16
//     layout, spec 3.1); `--int8-lm-head` counts the LM head as the CUDA backend holds it with
//     `serve --int8-lm-head` (INT8 [V, H] + one F32 scale per row).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/checkpoint.h"
#include "io/qwen35_config.h"

namespace moeserve::tools {

struct InspectOptions {
  std::string model_dir;      // a model directory; with config_only, a config.json or its directory
  bool config_only = false;   // plan from config.json alone (no weights needed)
  std::string weights;        // "" (as stored) or a convert --weights format to plan
  int64_t group_size = 128;   // INT4 group of a planned conversion
  bool int8_lm_head = false;  // count the LM head as INT8 row-wise
  bool json = false;          // machine-readable output
  bool list_tensors = false;  // one line per weight
  std::string device = "cpu"; // accepted like every subcommand; unused
  int threads = 0;            // accepted like every subcommand; unused
};

enum class WeightKind { Embedding, Attention, DeltaNet, Router, RoutedExperts, SharedExpert, Norm, LmHead, Mtp, Other };
std::string_view weight_kind_name(WeightKind kind);

// What inspect reads of a checkpoint: canonical tensor name -> dtype and shape.
struct CatalogEntry {
  DType dtype;
  Shape shape;
  uint64_t bytes() const { return uint64_t(shape_numel(shape)) * dtype_size(dtype); }
};
using TensorCatalog = std::map<std::string, CatalogEntry>;

// How the weights are counted: as stored, or as a planned conversion, and the LM head.
struct InspectPlan {
  std::string weights;        // "" / "keep": as stored; else gptq-int4, fp8-block, hybrid-int4-fp8
  int64_t group_size = 128;
  bool int8_lm_head = false;
};

// One weight as stored: a module's tensors together ("x.qweight" + "x.qzeros" + "x.scales" is
// the weight "x"), or a lone tensor such as "layers.0.linear_attn.A_log".
struct WeightInfo {
  std::string name;                  // canonical module name
  WeightKind kind = WeightKind::Other;
  std::string format;                // "bf16", "f32", "gptq-int4", "fp8-block", "nvfp4", ...
  Shape shape;                       // of the main tensor as stored
  std::vector<std::string> tensors;  // canonical tensor names
  uint64_t bytes = 0;                // all its tensors
};

// Bytes and counts per (kind, format).
struct KindSummary {
  WeightKind kind;
  std::string format;
  int64_t weights = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

struct DecodeBytes {
  uint64_t routed_experts = 0;  // already scaled by top-k / num_experts
  uint64_t embedding = 0;       // one row
  uint64_t lm_head = 0;         // the head as read (INT8 + row scales with int8_lm_head); in `other`
  uint64_t other = 0;           // everything else of the main model, read once
  uint64_t total = 0;
  uint64_t mtp_per_draft = 0;   // one MTP draft step (its routed experts scaled the same way)
};

struct InspectReport {
  std::filesystem::path model_dir;
  std::string planned;                   // non-empty: the weights are planned, e.g. "hybrid-int4-fp8
                                         // conversion of the BF16 layout of config.json"
  bool int8_lm_head = false;
  std::optional<io::Qwen35Config> config;
  std::string config_error;              // why config is absent
  std::vector<std::string> files;        // file names, in checkpoint order
  uint64_t file_bytes = 0;               // sum of file sizes (headers included)
  std::vector<WeightInfo> weights;       // sorted by name
  std::vector<KindSummary> summary;      // sorted by kind, then format
  uint64_t tensor_bytes = 0;
  std::optional<DecodeBytes> decode;     // needs the config
};

// The storage format of the weight `module` (a canonical module name); `tensors` are the
// checkpoint's tensor names that belong to it. Rules (../shared/spec/qwen35_arch.md 4 and
// DESIGN.md 4): ".qweight" -> GPTQ INT4; F8_E4M3 ".weight" + ".weight_scale_inv" -> FP8 block;
// ".weight_packed", or U8 ".weight" + ".weight_scale_2" -> NVFP4; else the dtype (dense).
std::string detect_weight_format(const TensorCatalog& tensors, const std::string& module,
                                 const std::vector<std::string>& module_tensors);
WeightKind classify_weight(const std::string& module);

// The report over a catalog (what inspect_checkpoint and inspect_config share); `model_dir`,
// `files`, `file_bytes` and `planned` are left to the caller.
InspectReport inspect_catalog(const TensorCatalog& tensors, std::optional<io::Qwen35Config> config,
                              std::string config_error, bool int8_lm_head);
InspectReport inspect_checkpoint(const std::filesystem::path& model_dir, const InspectPlan& plan = {});
// From config.json alone (a file, or a directory holding one): the official BF16 layout,
// converted as `plan.weights` says.
InspectReport inspect_config(const std::filesystem::path& config_path, const InspectPlan& plan = {});
std::string format_inspect_text(const InspectReport& report, bool list_tensors);
nlohmann::json inspect_to_json(const InspectReport& report, bool list_tensors);
// Prints the report to stdout; returns the exit code.
int run_inspect(const InspectOptions& options);

}  // namespace moeserve::tools
