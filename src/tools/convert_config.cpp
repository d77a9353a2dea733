#include "tools/convert_config.h"

#include <cctype>
#include <set>

#include "core/error.h"

namespace moeserve::tools {

namespace {

using ojson = nlohmann::ordered_json;

// "model.language_model.layers" for "model.language_model.layers.3.mlp.experts.0.up_proj";
// empty when the module is not inside a numbered block.
std::string block_name(const std::string& stored_module) {
  for (size_t pos = stored_module.find("layers."); pos != std::string::npos;
       pos = stored_module.find("layers.", pos + 1)) {
    if (pos != 0 && stored_module[pos - 1] != '.') continue;
    const size_t digits = pos + 7;
    if (digits < stored_module.size() && std::isdigit(static_cast<unsigned char>(stored_module[digits])))
      return stored_module.substr(0, pos + 6);
  }
  return "";
}

ojson bits16_entries(const ConvertPlan& plan) {
  ojson extra = ojson::object();
  for (const std::string& m : plan.dense_modules)
    if (m != "lm_head" && m.find(".lm_head") == std::string::npos) extra[m] = {{"bits", 16}, {"data_type", "fp"}};
  return extra;
}

std::string block_names(const ConvertPlan& plan) {
  std::vector<std::string> blocks;
  std::set<std::string> seen;
  for (const std::string& m : plan.int4_modules) {
    const std::string b = block_name(m);
    if (!b.empty() && seen.insert(b).second) blocks.push_back(b);
  }
  std::string out;
  for (const std::string& b : blocks) out += (out.empty() ? "" : ",") + b;
  return out;
}

}  // namespace

ojson int4_quantization_config(const ConvertPlan& plan, int64_t group_size) {
  ojson q;
  q["quant_method"] = "auto-round";
  q["packing_format"] = "auto_round:auto_gptq";
  q["bits"] = 4;
  q["group_size"] = group_size;
  q["sym"] = true;
  q["data_type"] = "int";
  q["iters"] = 0;  // AutoRound's RTN mode: round to nearest, no tuning
  q["block_name_to_quantize"] = block_names(plan);
  q["extra_config"] = bits16_entries(plan);
  return q;
}

ojson fp8_quantization_config(const ConvertPlan& plan) {
  ojson q;
  q["quant_method"] = "fp8";
  q["fmt"] = "e4m3";
  q["activation_scheme"] = "dynamic";
  q["weight_block_size"] = {128, 128};
  q["modules_to_not_convert"] = plan.dense_modules;
  return q;
}

ojson merged_hybrid_quantization_config(const ojson& experts_config, const std::string& experts_source,
                                        const std::string& experts_prefix, const std::string& output_prefix,
                                        const ConvertPlan& plan) {
  auto qc = experts_config.find("quantization_config");
  if (qc == experts_config.end() || !qc->is_object())
    fail("hybrid donors: {} has no quantization_config; the experts donor must be an INT4 (auto-round or gptq) "
         "checkpoint",
         experts_source);
  const auto method = qc->find("quant_method");
  if (method == qc->end() || !method->is_string() ||
      (method->get<std::string>() != "auto-round" && method->get<std::string>() != "gptq"))
    fail("hybrid donors: {} quantization_config.quant_method is {}; the experts donor must be an INT4 (auto-round "
         "or gptq) checkpoint",
         experts_source, method == qc->end() ? "absent" : method->dump());
  ojson out = *qc;
  ojson extra = ojson::object();
  if (auto old = qc->find("extra_config"); old != qc->end() && old->is_object())
    for (const auto& [key, value] : old->items()) {
      if (key.find(".experts.") == std::string::npos) continue;
      std::string renamed = key;
      if (!experts_prefix.empty() && key.compare(0, experts_prefix.size(), experts_prefix) == 0)
        renamed = output_prefix + key.substr(experts_prefix.size());
      extra[renamed] = value;
    }
  const ojson bits16 = bits16_entries(plan);
  for (const auto& [key, value] : bits16.items()) extra[key] = value;
  out["extra_config"] = extra;
  return out;
}

void set_quantization_config(ojson& config, ojson quantization_config) {
  config["quantization_config"] = std::move(quantization_config);
}

int64_t mtp_num_hidden_layers(const ojson& config) {
  const ojson* text = &config;
  if (auto it = config.find("text_config"); it != config.end() && it->is_object()) text = &*it;
  auto it = text->find("mtp_num_hidden_layers");
  return (it != text->end() && it->is_number_integer()) ? it->get<int64_t>() : 0;
}

bool set_mtp_layers_if_missing(ojson& config, int64_t layers) {
  if (mtp_num_hidden_layers(config) > 0) return false;
  ojson* text = &config;
  if (auto it = config.find("text_config"); it != config.end() && it->is_object()) text = &*it;
  (*text)["mtp_num_hidden_layers"] = layers;
  return true;
}

}  // namespace moeserve::tools
