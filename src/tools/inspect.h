// `moeserve inspect MODEL_DIR`: what a checkpoint holds and what decoding it costs.
//   - the architecture from config.json (layers and their types, heads, experts, dims);
//   - every weight grouped by kind (embedding, attention, deltanet, router, routed experts,
//     shared expert, norms, lm_head, mtp) with its storage format and bytes on disk;
//   - the bytes read per decoded token at batch size 1: routed experts scaled by
//     top-k / num_experts, the embedding as one row, everything else read fully once
//     (the KV cache and the GDN state are not included).
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
  std::string model_dir;
  bool json = false;          // machine-readable output
  bool list_tensors = false;  // one line per weight
  std::string device = "cpu"; // accepted like every subcommand; unused
  int threads = 0;            // accepted like every subcommand; unused
};

enum class WeightKind { Embedding, Attention, DeltaNet, Router, RoutedExperts, SharedExpert, Norm, LmHead, Mtp, Other };
std::string_view weight_kind_name(WeightKind kind);

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
  uint64_t other = 0;           // everything else of the main model, read once
  uint64_t total = 0;
  uint64_t mtp_per_draft = 0;   // one MTP draft step (its routed experts scaled the same way)
};

struct InspectReport {
  std::filesystem::path model_dir;
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
std::string detect_weight_format(const io::Checkpoint& ckpt, const std::string& module,
                                 const std::vector<std::string>& tensors);
WeightKind classify_weight(const std::string& module);

InspectReport inspect_checkpoint(const std::filesystem::path& model_dir);
std::string format_inspect_text(const InspectReport& report, bool list_tensors);
nlohmann::json inspect_to_json(const InspectReport& report, bool list_tensors);
// Prints the report to stdout; returns the exit code.
int run_inspect(const InspectOptions& options);

}  // namespace moeserve::tools
