// Checkpoint analysis for `moeserve inspect` (inspect.h): weights grouped per module, their
// kinds and formats, bytes on disk and bytes read per decoded token.
#include "tools/inspect.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include "core/error.h"

namespace moeserve::tools {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// Suffixes of the tensors that together store one weight, in every format we read.
constexpr std::array<std::string_view, 14> kWeightSuffixes = {
    ".weight",        ".bias",          ".qweight",          ".qzeros",          ".scales",
    ".g_idx",         ".weight_scale_inv", ".weight_packed", ".weight_scale",    ".weight_scale_2",
    ".weight_global_scale", ".input_global_scale", ".input_scale", ".weight_zero_point"};

// The module a tensor belongs to: its name without a weight-storage suffix.
std::string module_of(const std::string& tensor) {
  for (std::string_view suffix : kWeightSuffixes)
    if (ends_with(tensor, suffix)) return tensor.substr(0, tensor.size() - suffix.size());
  return tensor;
}

// The tensor whose shape describes the weight.
std::string main_tensor(const TensorCatalog& tensors, const std::string& module) {
  for (std::string_view suffix : {".weight_packed", ".qweight", ".weight"})
    if (tensors.count(module + std::string(suffix))) return module + std::string(suffix);
  return tensors.count(module) ? module : std::string();
}

// The CUDA backend's `--int8-lm-head` copy of a [V, H] head: INT8 codes + one F32 scale per row.
uint64_t int8_rowwise_bytes(const Shape& shape) {
  if (shape.size() != 2) return 0;
  return uint64_t(shape[0]) * uint64_t(shape[1]) + uint64_t(shape[0]) * sizeof(float);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string_view weight_kind_name(WeightKind kind) {
  switch (kind) {
    case WeightKind::Embedding: return "embedding";
    case WeightKind::Attention: return "attention";
    case WeightKind::DeltaNet: return "deltanet";
    case WeightKind::Router: return "router";
    case WeightKind::RoutedExperts: return "routed experts";
    case WeightKind::SharedExpert: return "shared expert";
    case WeightKind::Norm: return "norms";
    case WeightKind::LmHead: return "lm_head";
    case WeightKind::Mtp: return "mtp";
    case WeightKind::Other: return "other";
  }
  return "other";
}

WeightKind classify_weight(const std::string& module) {
  if (module.rfind("mtp.", 0) == 0) return WeightKind::Mtp;
  if (module == "embed_tokens") return WeightKind::Embedding;
  if (module == "lm_head") return WeightKind::LmHead;
  const std::string_view last = std::string_view(module).substr(module.rfind('.') + 1);
  if (contains(last, "norm")) return WeightKind::Norm;
  if (contains(module, ".mlp.experts.") || ends_with(module, ".mlp.experts")) return WeightKind::RoutedExperts;
  if (contains(module, ".mlp.shared_expert")) return WeightKind::SharedExpert;  // also shared_expert_gate
  if (ends_with(module, ".mlp.gate")) return WeightKind::Router;
  if (contains(module, ".self_attn.")) return WeightKind::Attention;
  if (contains(module, ".linear_attn.")) return WeightKind::DeltaNet;
  return WeightKind::Other;
}

std::string detect_weight_format(const TensorCatalog& catalog, const std::string& module,
                                 const std::vector<std::string>& tensors) {
  auto has = [&](const char* suffix) { return catalog.count(module + suffix) != 0; };
  auto dtype_of = [&](const char* suffix) { return catalog.at(module + suffix).dtype; };
  if (has(".qweight")) return has(".g_idx") ? "gptq-int4+g_idx" : "gptq-int4";
  if (has(".weight_packed")) return "nvfp4";
  if (has(".weight") && dtype_of(".weight") == DType::U8 && has(".weight_scale_2")) return "nvfp4-modelopt";
  if (has(".weight") && dtype_of(".weight") == DType::F8_E4M3) {
    if (has(".weight_scale_inv")) return "fp8-block";
    return "fp8";
  }
  const std::string main = main_tensor(catalog, module);
  if (!main.empty()) return lower(dtype_name(catalog.at(main).dtype));
  return tensors.empty() ? "unknown" : lower(dtype_name(catalog.at(tensors.front()).dtype));
}

InspectReport inspect_catalog(const TensorCatalog& catalog, std::optional<io::Qwen35Config> config,
                              std::string config_error, bool int8_lm_head) {
  InspectReport report;
  report.config = std::move(config);
  report.config_error = std::move(config_error);
  report.int8_lm_head = int8_lm_head;

  // Group tensors into weights (names are sorted, so a module's tensors are adjacent or
  // close; a map keeps it simple).
  std::map<std::string, std::vector<std::string>> modules;
  for (const auto& [name, entry] : catalog) modules[module_of(name)].push_back(name);
  for (auto& [module, tensors] : modules) {
    WeightInfo w;
    w.name = module;
    w.kind = classify_weight(module);
    w.format = detect_weight_format(catalog, module, tensors);
    const std::string main = main_tensor(catalog, module);
    w.shape = catalog.at(main.empty() ? tensors.front() : main).shape;
    for (const std::string& t : tensors) w.bytes += catalog.at(t).bytes();
    w.tensors = std::move(tensors);
    report.tensor_bytes += w.bytes;
    report.weights.push_back(std::move(w));
  }

  std::map<std::pair<WeightKind, std::string>, KindSummary> summary;
  for (const WeightInfo& w : report.weights) {
    KindSummary& s = summary[{w.kind, w.format}];
    s.kind = w.kind;
    s.format = w.format;
    s.weights += 1;
    s.tensors += int64_t(w.tensors.size());
    s.bytes += w.bytes;
  }
  for (auto& [key, s] : summary) report.summary.push_back(s);

  if (report.config) {
    const io::Qwen35Config& c = *report.config;
    // Batch-1 decode reads k of E experts per MoE layer (on average over tokens).
    const double expert_fraction = double(c.num_experts_per_tok) / double(c.num_experts);
    DecodeBytes d;
    uint64_t lm_head_bytes = 0, embedding_row = 0, embedding_bytes = 0;
    double routed = 0, mtp_routed = 0;
    for (const WeightInfo& w : report.weights) {
      if (w.kind == WeightKind::Mtp) {
        if (contains(w.name, ".mlp.experts"))
          mtp_routed += double(w.bytes) * expert_fraction;
        else
          d.mtp_per_draft += w.bytes;
        continue;
      }
      switch (w.kind) {
        case WeightKind::RoutedExperts: routed += double(w.bytes) * expert_fraction; break;
        case WeightKind::Embedding:
          // A lookup reads one row of the table.
          embedding_bytes = w.bytes;
          embedding_row = (!w.shape.empty() && w.shape[0] > 0) ? w.bytes / uint64_t(w.shape[0]) : w.bytes;
          break;
        case WeightKind::LmHead: {
          // A dense head held as INT8 rows by the CUDA backend (--int8-lm-head); a quantised one
          // is read as stored.
          const bool dense = w.format == "bf16" || w.format == "f16" || w.format == "f32";
          const uint64_t read = int8_lm_head && dense ? int8_rowwise_bytes(w.shape) : w.bytes;
          lm_head_bytes += read;
          d.other += read;
          break;
        }
        default: d.other += w.bytes; break;
      }
    }
    if (lm_head_bytes == 0 && c.tie_word_embeddings) {  // the tied head reads the whole table
      lm_head_bytes = int8_lm_head ? int8_rowwise_bytes({c.vocab_size, c.hidden_size}) : embedding_bytes;
      d.other += lm_head_bytes;
    }
    d.lm_head = lm_head_bytes;
    d.routed_experts = uint64_t(std::llround(routed));
    d.embedding = embedding_row;
    d.total = d.routed_experts + d.embedding + d.other;
    // A draft step also runs the shared lm_head and looks up one embedding row.
    if (d.mtp_per_draft > 0 || mtp_routed > 0)
      d.mtp_per_draft += uint64_t(std::llround(mtp_routed)) + lm_head_bytes + embedding_row;
    report.decode = d;
  }
  return report;
}

}  // namespace moeserve::tools
