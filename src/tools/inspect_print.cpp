// Text and JSON renderings of an InspectReport.
#include <fmt/format.h>

#include "tools/inspect.h"

namespace moeserve::tools {

namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

// "LLLF" per layer, compressed into runs of a repeating group when it repeats.
std::string layer_pattern(const std::vector<io::LayerType>& types) {
  std::string s;
  for (io::LayerType t : types) s += t == io::LayerType::FullAttention ? 'F' : 'L';
  for (size_t period = 1; period <= s.size() / 2; ++period) {
    if (s.size() % period != 0) continue;
    bool repeats = true;
    for (size_t i = period; i < s.size() && repeats; ++i) repeats = s[i] == s[i - period];
    if (repeats) return fmt::format("{} x {}", s.substr(0, period), s.size() / period);
  }
  return s;
}

void append_architecture(std::string& out, const io::Qwen35Config& c) {
  out += fmt::format("architecture  {} (text model {})\n", c.outer_model_type, c.model_type);
  std::string full;
  for (size_t i = 0; i < c.layer_types.size(); ++i)
    if (c.layer_types[i] == io::LayerType::FullAttention) {
      if (!full.empty()) full += ',';
      full += std::to_string(i);
    }
  out += fmt::format("  layers      {}: {} Gated DeltaNet (L) + {} gated full attention (F); pattern {}\n",
                     c.num_hidden_layers, c.num_linear_attention_layers(), c.num_full_attention_layers(),
                     layer_pattern(c.layer_types));
  out += fmt::format("  full attn   layers {}\n", full.empty() ? "none" : full);
  out += fmt::format("  dims        hidden {}, vocab {}, max positions {}, rms eps {:g}\n", c.hidden_size,
                     c.vocab_size, c.max_position_embeddings, c.rms_norm_eps);
  out += fmt::format("  attention   {} q heads, {} kv heads, head dim {}, rotary dim {} (theta {:g}, {})\n",
                     c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim(), c.rope_theta,
                     c.rope_type);
  out += fmt::format("  deltanet    {} k heads x {}, {} v heads x {}, conv kernel {} (conv dim {})\n",
                     c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads,
                     c.linear_value_head_dim, c.linear_conv_kernel_dim, c.linear_conv_dim());
  out += fmt::format("  moe         {} experts, top {}, expert intermediate {}, shared expert intermediate {}\n",
                     c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                     c.shared_expert_intermediate_size);
  out += fmt::format("  mtp         {} layer(s); tied embeddings: {}\n", c.mtp_num_hidden_layers,
                     c.tie_word_embeddings ? "yes" : "no");
  if (c.quantization) {
    const io::QuantizationConfig& q = *c.quantization;
    out += fmt::format("  quantized   {}", q.quant_method);
    if (q.bits) out += fmt::format(", {} bits", q.bits);
    if (q.group_size) out += fmt::format(", group {}", q.group_size);
    if (!q.weight_block_size.empty())
      out += fmt::format(", block {}x{}", q.weight_block_size[0], q.weight_block_size[1]);
    out += "\n";
  }
}

}  // namespace

std::string format_inspect_text(const InspectReport& r, bool list_tensors) {
  std::string out = fmt::format("model         {}\n", r.model_dir.string());
  if (!r.files.empty())
    out += fmt::format("files         {} ({}): {}\n", r.files.size(), human_bytes(r.file_bytes),
                       fmt::join(r.files, ", "));
  if (!r.planned.empty()) out += fmt::format("weights       planned: {}\n", r.planned);
  if (r.config)
    append_architecture(out, *r.config);
  else
    out += fmt::format("config        unavailable: {}\n", r.config_error);

  out += "\nweights by kind\n";
  out += fmt::format("  {:<16} {:<16} {:>8} {:>8} {:>16} {:>12}\n", "kind", "format", "weights", "tensors",
                     "bytes", "");
  for (const KindSummary& s : r.summary)
    out += fmt::format("  {:<16} {:<16} {:>8} {:>8} {:>16} {:>12}\n", weight_kind_name(s.kind), s.format,
                       s.weights, s.tensors, s.bytes, human_bytes(s.bytes));
  out += fmt::format("  {:<16} {:<16} {:>8} {:>8} {:>16} {:>12}\n", "total", "", r.weights.size(), "",
                     r.tensor_bytes, human_bytes(r.tensor_bytes));

  if (r.decode && r.config) {
    const DecodeBytes& d = *r.decode;
    out += "\nbytes read per decoded token (batch 1; KV cache and GDN state excluded)\n";
    out += fmt::format("  routed experts  {:>16} {:>12}  (x {}/{} experts)\n", d.routed_experts,
                       human_bytes(d.routed_experts), r.config->num_experts_per_tok, r.config->num_experts);
    out += fmt::format("  embedding row   {:>16} {:>12}\n", d.embedding, human_bytes(d.embedding));
    out += fmt::format("  everything else {:>16} {:>12}\n", d.other, human_bytes(d.other));
    out += fmt::format("    of it lm_head {:>16} {:>12}{}\n", d.lm_head, human_bytes(d.lm_head),
                       r.int8_lm_head ? "  (INT8 row-wise, as serve --int8-lm-head holds it)" : "");
    out += fmt::format("  total           {:>16} {:>12}  ({:.3f} GB)\n", d.total, human_bytes(d.total),
                       double(d.total) / 1e9);
    if (d.mtp_per_draft)
      out += fmt::format("  mtp draft step  {:>16} {:>12}  (MTP layer + lm_head + embedding row)\n",
                         d.mtp_per_draft, human_bytes(d.mtp_per_draft));
  }

  if (list_tensors) {
    out += "\nweights\n";
    for (const WeightInfo& w : r.weights)
      out += fmt::format("  {:<60} {:<15} {:<16} {:<20} {:>14}\n", w.name, weight_kind_name(w.kind), w.format,
                         shape_to_string(w.shape), w.bytes);
  }
  return out;
}

nlohmann::json inspect_to_json(const InspectReport& r, bool list_tensors) {
  nlohmann::json j;
  j["model_dir"] = r.model_dir.string();
  if (!r.planned.empty()) j["planned"] = r.planned;
  j["int8_lm_head"] = r.int8_lm_head;
  j["files"] = r.files;
  j["file_bytes"] = r.file_bytes;
  j["tensor_bytes"] = r.tensor_bytes;
  if (r.config) {
    const io::Qwen35Config& c = *r.config;
    std::vector<std::string> types;
    for (io::LayerType t : c.layer_types) types.emplace_back(io::layer_type_name(t));
    j["config"] = {{"model_type", c.outer_model_type},
                   {"num_hidden_layers", c.num_hidden_layers},
                   {"layer_types", types},
                   {"hidden_size", c.hidden_size},
                   {"vocab_size", c.vocab_size},
                   {"num_attention_heads", c.num_attention_heads},
                   {"num_key_value_heads", c.num_key_value_heads},
                   {"head_dim", c.head_dim},
                   {"rotary_dim", c.rotary_dim()},
                   {"linear_num_key_heads", c.linear_num_key_heads},
                   {"linear_num_value_heads", c.linear_num_value_heads},
                   {"linear_key_head_dim", c.linear_key_head_dim},
                   {"linear_value_head_dim", c.linear_value_head_dim},
                   {"num_experts", c.num_experts},
                   {"num_experts_per_tok", c.num_experts_per_tok},
                   {"moe_intermediate_size", c.moe_intermediate_size},
                   {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
                   {"mtp_num_hidden_layers", c.mtp_num_hidden_layers},
                   {"quant_method", c.quantization ? c.quantization->quant_method : ""}};
  } else {
    j["config_error"] = r.config_error;
  }
  j["kinds"] = nlohmann::json::array();
  for (const KindSummary& s : r.summary)
    j["kinds"].push_back({{"kind", weight_kind_name(s.kind)},
                          {"format", s.format},
                          {"weights", s.weights},
                          {"tensors", s.tensors},
                          {"bytes", s.bytes}});
  if (r.decode)
    j["bytes_per_token"] = {{"routed_experts", r.decode->routed_experts},
                            {"embedding", r.decode->embedding},
                            {"lm_head", r.decode->lm_head},
                            {"other", r.decode->other},
                            {"total", r.decode->total},
                            {"mtp_per_draft", r.decode->mtp_per_draft}};
  if (list_tensors) {
    j["weights"] = nlohmann::json::array();
    for (const WeightInfo& w : r.weights)
      j["weights"].push_back({{"name", w.name},
                              {"kind", weight_kind_name(w.kind)},
                              {"format", w.format},
                              {"shape", w.shape},
                              {"tensors", w.tensors},
                              {"bytes", w.bytes}});
  }
  return j;
}

int run_inspect(const InspectOptions& options) {
  const InspectPlan plan{options.weights, options.group_size, options.int8_lm_head};
  const InspectReport report =
      options.config_only ? inspect_config(options.model_dir, plan) : inspect_checkpoint(options.model_dir, plan);
  if (options.json)
    fmt::print("{}\n", inspect_to_json(report, options.list_tensors).dump(2));
  else
    fmt::print("{}", format_inspect_text(report, options.list_tensors));
  return 0;
}

}  // namespace moeserve::tools
