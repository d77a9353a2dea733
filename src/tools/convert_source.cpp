#include "tools/convert_source.h"

#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_text.h"
#include "core/log.h"
#include "io/checkpoint.h"

namespace moeserve::tools {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kMtpFile = "mtp.safetensors";

nlohmann::ordered_json parse_json_file(const fs::path& path) {
  try {
    return nlohmann::ordered_json::parse(read_file_text(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// tensor name -> shard file, when the directory is read through its index.
std::map<std::string, std::string> index_assignment(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / kSingleFile, ec) || !fs::exists(dir / kIndexFile, ec)) return {};
  const nlohmann::ordered_json index = parse_json_file(dir / kIndexFile);
  std::map<std::string, std::string> out;
  // io::Checkpoint::open has validated the index's shape already.
  for (const auto& [tensor, shard] : index.at("weight_map").items()) out.emplace(tensor, shard.get<std::string>());
  return out;
}

// The architecture fields two checkpoints must agree on to be combined.
void check_same_architecture(const io::Qwen35Config& a, const std::string& a_source, const io::Qwen35Config& b,
                             const std::string& b_source, const std::string& what, bool layers_too) {
  auto same = [&](const char* field, int64_t x, int64_t y) {
    if (x != y) fail("{} disagree: {} is {} in {} but {} in {}", what, field, x, a_source, y, b_source);
  };
  same("hidden_size", a.hidden_size, b.hidden_size);
  same("vocab_size", a.vocab_size, b.vocab_size);
  same("num_attention_heads", a.num_attention_heads, b.num_attention_heads);
  same("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads);
  same("head_dim", a.head_dim, b.head_dim);
  same("num_experts", a.num_experts, b.num_experts);
  same("moe_intermediate_size", a.moe_intermediate_size, b.moe_intermediate_size);
  same("shared_expert_intermediate_size", a.shared_expert_intermediate_size, b.shared_expert_intermediate_size);
  if (!layers_too) return;
  same("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers);
  same("num_experts_per_tok", a.num_experts_per_tok, b.num_experts_per_tok);
  same("linear_num_key_heads", a.linear_num_key_heads, b.linear_num_key_heads);
  same("linear_num_value_heads", a.linear_num_value_heads, b.linear_num_value_heads);
  same("linear_key_head_dim", a.linear_key_head_dim, b.linear_key_head_dim);
  same("linear_value_head_dim", a.linear_value_head_dim, b.linear_value_head_dim);
  for (size_t l = 0; l < a.layer_types.size(); ++l)
    if (a.layer_types[l] != b.layer_types[l])
      fail("{} disagree: layer {} is {} in {} but {} in {}", what, l, io::layer_type_name(a.layer_types[l]), a_source,
           io::layer_type_name(b.layer_types[l]), b_source);
}

using TensorsByCanonical = std::map<std::string, const SourceTensor*>;

TensorsByCanonical by_canonical(const std::vector<SourceTensor>& tensors) {
  TensorsByCanonical out;
  for (const SourceTensor& t : tensors)
    if (!t.canonical.empty()) out.emplace(t.canonical, &t);
  return out;
}

// The [N, K] a Linear module's stored tensors describe, in any format: ".weight" [N, K]
// (dense or FP8), ".qweight" [K/8, N] (GPTQ INT4), ".weight_packed" [N, K/2] (NVFP4).
const SourceTensor* find_linear(const TensorsByCanonical& tensors, const std::string& module, Shape* nk) {
  auto it = tensors.find(module + ".qweight");
  if (it != tensors.end() && it->second->shape().size() == 2) {
    *nk = {it->second->shape()[1], it->second->shape()[0] * 8};
    return it->second;
  }
  it = tensors.find(module + ".weight_packed");
  if (it != tensors.end() && it->second->shape().size() == 2) {
    *nk = {it->second->shape()[0], it->second->shape()[1] * 2};
    return it->second;
  }
  it = tensors.find(module + ".weight");
  if (it != tensors.end()) {
    *nk = it->second->shape();
    // ModelOpt NVFP4 stores packed U8 codes as ".weight" [N, K/2].
    if (it->second->dtype() == DType::U8 && nk->size() == 2) (*nk)[1] *= 2;
    return it->second;
  }
  return nullptr;
}

// Every routed-expert module of `experts` must exist with the shape the config gives.
void check_expert_modules(const SourceCheckpoint& experts, const io::Qwen35Config& c, const std::string& config_source) {
  const TensorsByCanonical tensors = by_canonical(experts.tensors);
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string base = fmt::format("layers.{}.mlp.experts.", l);
    if (auto fused = tensors.find(base + "gate_up_proj"); fused != tensors.end()) {
      auto down = tensors.find(base + "down_proj");
      const Shape want_gu{E, 2 * I, H}, want_down{E, H, I};
      if (fused->second->shape() != want_gu)
        fail("hybrid donors disagree: {} ({}) is {} but {} gives [E, 2I, H] = {}", fused->second->name,
             fused->second->origin, shape_to_string(fused->second->shape()), config_source, shape_to_string(want_gu));
      if (down == tensors.end())
        fail("hybrid donors: {} has {} but no {}down_proj", experts.dir.string(), fused->second->name, base);
      if (down->second->shape() != want_down)
        fail("hybrid donors disagree: {} ({}) is {} but {} gives [E, H, I] = {}", down->second->name,
             down->second->origin, shape_to_string(down->second->shape()), config_source, shape_to_string(want_down));
      continue;
    }
    for (int64_t e = 0; e < E; ++e)
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string module = base + std::to_string(e) + "." + proj;
        const Shape want = std::string(proj) == "down_proj" ? Shape{H, I} : Shape{I, H};
        Shape got;
        const SourceTensor* t = find_linear(tensors, module, &got);
        if (!t)
          fail("hybrid donors: the experts checkpoint {} has no routed expert module '{}' (no .qweight, "
               ".weight_packed or .weight tensor)",
               experts.dir.string(), module);
        if (got != want)
          fail("hybrid donors disagree: routed expert '{}' ({}: {}) is [N, K] = {} but {} gives {}", module,
               t->origin, t->name, shape_to_string(got), config_source, shape_to_string(want));
      }
  }
}

}  // namespace

std::string SourceTensor::prefix() const {
  if (canonical.empty() || canonical.size() > name.size() ||
      name.compare(name.size() - canonical.size(), canonical.size(), canonical) != 0)
    return "";
  return name.substr(0, name.size() - canonical.size());
}

io::Qwen35Config SourceCheckpoint::qwen35_config() const {
  if (!config) fail("{} does not exist: '{}' is not a model checkpoint", config_path().string(), dir.string());
  return io::parse_qwen35_config(nlohmann::json::parse(config->dump()), config_path().string());
}

SourceCheckpoint open_source_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("'{}' is not a checkpoint directory", dir.string());
  SourceCheckpoint out;
  out.dir = dir;
  if (fs::exists(dir / "config.json", ec)) out.config = parse_json_file(dir / "config.json");
  // io::Checkpoint validates every file and the index, and decides which files hold the model.
  const io::Checkpoint ckpt = io::Checkpoint::open(dir);
  const std::map<std::string, std::string> index = index_assignment(dir);
  for (const auto& file : ckpt.files()) {
    const std::string shard = file->path().filename().string();
    for (const io::TensorInfo& info : file->tensors()) {
      if (!index.empty() && shard != kMtpFile) {
        auto it = index.find(info.name);
        if (it == index.end() || it->second != shard) continue;  // stale copy: not in the model
      }
      SourceTensor t;
      t.name = info.name;
      t.canonical = io::canonical_tensor_name(info.name).value_or("");
      t.view = file->tensor(info.name);
      t.origin = (dir / shard).string();
      out.tensors.push_back(std::move(t));
    }
  }
  return out;
}

bool is_main_routed_expert(const std::string& canonical) {
  if (!starts_with(canonical, "layers.")) return false;
  const size_t dot = canonical.find('.', 7);
  return dot != std::string::npos && canonical.compare(dot, 13, ".mlp.experts.") == 0;
}

std::string dominant_prefix(const std::vector<SourceTensor>& tensors) {
  std::map<std::string, size_t> counts;
  for (const SourceTensor& t : tensors)
    if (starts_with(t.canonical, "layers.")) ++counts[t.prefix()];
  std::string best;
  size_t best_count = 0;
  for (const auto& [prefix, n] : counts)
    if (n > best_count) best = prefix, best_count = n;
  return best;
}

SourceCheckpoint assemble_hybrid_donors(const SourceCheckpoint& experts, const SourceCheckpoint& dense) {
  const io::Qwen35Config ce = experts.qwen35_config(), cd = dense.qwen35_config();
  check_same_architecture(ce, experts.config_path().string(), cd, dense.config_path().string(),
                          "hybrid donors", /*layers_too=*/true);
  check_expert_modules(experts, cd, dense.config_path().string());

  SourceCheckpoint out;
  out.dir = dense.dir;
  out.config = dense.config;
  for (const SourceTensor& t : dense.tensors)
    if (!is_main_routed_expert(t.canonical)) out.tensors.push_back(t);
  const std::string prefix = dominant_prefix(dense.tensors);
  size_t moved = 0;
  for (const SourceTensor& t : experts.tensors) {
    if (!is_main_routed_expert(t.canonical)) continue;
    SourceTensor moved_tensor = t;
    moved_tensor.name = prefix + t.canonical;
    out.tensors.push_back(std::move(moved_tensor));
    ++moved;
  }
  log::info("hybrid donors: {} routed-expert tensors from {}, {} other tensors from {}", moved,
            experts.dir.string(), out.tensors.size() - moved, dense.dir.string());
  return out;
}

SourceCheckpoint assemble_mtp_donor(SourceCheckpoint base, const SourceCheckpoint& donor) {
  std::vector<SourceTensor> mtp;
  for (const SourceTensor& t : donor.tensors)
    if (starts_with(t.canonical, "mtp.")) mtp.push_back(t);
  if (mtp.empty()) fail("--add-mtp-from {}: the checkpoint has no mtp.* tensors", donor.dir.string());
  if (base.config && donor.config)
    check_same_architecture(base.qwen35_config(), base.config_path().string(), donor.qwen35_config(),
                            donor.config_path().string(), "--add-mtp-from: the checkpoints", /*layers_too=*/false);
  size_t replaced = 0;
  std::vector<SourceTensor> kept;
  for (SourceTensor& t : base.tensors) {
    if (starts_with(t.canonical, "mtp."))
      ++replaced;
    else
      kept.push_back(std::move(t));
  }
  if (replaced) log::info("--add-mtp-from: replacing the {} mtp.* tensors of {}", replaced, base.dir.string());
  for (SourceTensor& t : mtp) kept.push_back(std::move(t));
  base.tensors = std::move(kept);
  return base;
}

}  // namespace moeserve::tools
