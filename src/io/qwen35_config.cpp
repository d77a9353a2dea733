// config.json -> Qwen35Config (../shared/spec/qwen35_arch.md sections 1 and 6).
// Defaults are those of transformers' Qwen3_5MoeTextConfig (the 35B-A3B shape), applied to
// fields that are absent or null.
#include "io/qwen35_config.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/file_text.h"
#include "io/json_fields.h"

namespace moeserve::io {

namespace {

// Sizes above this are not a model we could hold; rejecting them keeps products of sizes
// (e.g. heads * head_dim * hidden) far from int64 overflow.
constexpr int64_t kMaxSize = int64_t(1) << 31;

int64_t size_field(const JsonFields& f, const char* key, int64_t fallback) {
  const int64_t v = f.integer(key).value_or(fallback);
  if (v <= 0) fail("{} must be positive, found {}", f.where(key), v);
  if (v > kMaxSize) fail("{} is implausibly large ({})", f.where(key), v);
  return v;
}

std::vector<LayerType> parse_layer_types(const JsonFields& text, int64_t num_layers) {
  std::vector<LayerType> types;
  if (auto names = text.string_list("layer_types")) {
    if (int64_t(names->size()) != num_layers)
      fail("{} has {} entries, but num_hidden_layers is {}", text.where("layer_types"), names->size(),
           num_layers);
    for (size_t i = 0; i < names->size(); ++i) {
      const std::string& n = (*names)[i];
      if (n == "linear_attention")
        types.push_back(LayerType::LinearAttention);
      else if (n == "full_attention")
        types.push_back(LayerType::FullAttention);
      else
        fail("{}[{}] is '{}'; expected 'linear_attention' or 'full_attention'",
             text.where("layer_types"), i, n);
    }
    return types;
  }
  // HF rule: layer i is full attention iff (i + 1) % interval == 0.
  const int64_t interval = text.integer("full_attention_interval").value_or(4);
  if (interval <= 0) fail("{} must be positive, found {}", text.where("full_attention_interval"), interval);
  for (int64_t i = 0; i < num_layers; ++i)
    types.push_back((i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  return types;
}

// rope_parameters (transformers 5) first; legacy top-level rope_theta / partial_rotary_factor
// / rope_scaling fill what it does not say.
void parse_rope(const JsonFields& text, Qwen35Config& c) {
  std::optional<JsonFields> params = text.object("rope_parameters");
  std::optional<JsonFields> scaling = text.object("rope_scaling");
  auto pick_number = [&](const char* key) -> std::optional<double> {
    if (params)
      if (auto v = params->number(key)) return v;
    if (auto v = text.number(key)) return v;
    if (scaling)
      if (auto v = scaling->number(key)) return v;
    return std::nullopt;
  };
  auto where = [&](const char* key) {
    if (params && params->has(key)) return params->where(key);
    if (text.has(key)) return text.where(key);
    if (scaling && scaling->has(key)) return scaling->where(key);
    return text.where(key);
  };

  c.rope_theta = pick_number("rope_theta").value_or(c.rope_theta);
  if (!(c.rope_theta > 0)) fail("{} must be positive, found {}", where("rope_theta"), c.rope_theta);
  c.partial_rotary_factor = pick_number("partial_rotary_factor").value_or(0.25);
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    fail("{} must be in (0, 1], found {}", where("partial_rotary_factor"), c.partial_rotary_factor);

  for (const std::optional<JsonFields>& src : {params, scaling}) {
    if (!src) continue;
    std::optional<std::string> type = src->string("rope_type");
    if (!type) type = src->string("type");  // legacy rope_scaling spelling
    if (type && c.rope_type == "default") c.rope_type = *type;
    if (c.mrope_section.empty())
      if (auto section = src->integer_list("mrope_section"))
        for (int64_t s : *section) {
          if (s < 0 || s > kMaxSize) fail("{} has the invalid entry {}", src->where("mrope_section"), s);
          c.mrope_section.push_back(int(s));
        }
    if (auto interleaved = src->boolean("mrope_interleaved")) c.mrope_interleaved = *interleaved;
    if (auto factor = src->number("factor"); factor && c.rope_scaling_factor == 1.0) c.rope_scaling_factor = *factor;
    if (auto orig = src->integer("original_max_position_embeddings"); orig && c.original_max_position_embeddings == 0)
      c.original_max_position_embeddings = *orig;
  }
  // M-RoPE as "mrope" or "default" both mean plain RoPE for text.
  if (c.rope_type == "mrope") c.rope_type = "default";
  static const std::vector<std::string> kKnown = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
  if (std::find(kKnown.begin(), kKnown.end(), c.rope_type) == kKnown.end())
    fail("{}: unknown rope_type '{}'", text.source(), c.rope_type);
  if (!(c.rope_scaling_factor > 0)) fail("{}: rope scaling factor must be positive", text.source());
  if (c.original_max_position_embeddings < 0)
    fail("{}: original_max_position_embeddings must not be negative", text.source());
  if (params) c.rope_parameters_raw = params->json();
  else if (scaling) c.rope_parameters_raw = scaling->json();
}

std::vector<int64_t> parse_eos(const JsonFields& f) {
  const nlohmann::json* v = f.find("eos_token_id");
  if (!v) return {};
  std::vector<int64_t> ids;
  if (v->is_array())
    ids = *f.integer_list("eos_token_id");
  else
    ids = {*f.integer("eos_token_id")};
  for (int64_t id : ids)
    if (id < 0) fail("{} has the negative id {}", f.where("eos_token_id"), id);
  return ids;
}

void validate(const Qwen35Config& c, const JsonFields& text) {
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", text.source(),
         c.num_attention_heads, c.num_key_value_heads);
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    fail("{}: linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
         text.source(), c.linear_num_value_heads, c.linear_num_key_heads);
  if (c.num_experts_per_tok > c.num_experts)
    fail("{}: num_experts_per_tok ({}) exceeds num_experts ({})", text.source(), c.num_experts_per_tok,
         c.num_experts);
  const double exact_rotary = double(c.head_dim) * c.partial_rotary_factor;
  const int64_t rot = c.rotary_dim();
  if (rot <= 0 || rot % 2 != 0 || rot > c.head_dim)
    fail("{}: rotary dim head_dim * partial_rotary_factor = {} * {} = {} must be even, positive and "
         "at most head_dim",
         text.source(), c.head_dim, c.partial_rotary_factor, exact_rotary);
  if (!c.mrope_section.empty()) {
    const int64_t sum = std::accumulate(c.mrope_section.begin(), c.mrope_section.end(), int64_t(0));
    if (sum != rot / 2)
      fail("{}: mrope_section sums to {}, but the rotary dim {} has {} frequencies", text.source(), sum,
           rot, rot / 2);
  }
  if (c.hidden_act != "silu" && c.hidden_act != "swish")
    fail("{}: unsupported hidden_act '{}' (Qwen3.5 uses silu)", text.where("hidden_act"), c.hidden_act);
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1))
    fail("{} must be in (0, 1), found {}", text.where("rms_norm_eps"), c.rms_norm_eps);
  if (c.mtp_num_hidden_layers < 0 || c.mtp_num_hidden_layers > 64)
    fail("{} must be between 0 and 64, found {}", text.where("mtp_num_hidden_layers"),
         c.mtp_num_hidden_layers);
}

}  // namespace

std::string_view layer_type_name(LayerType t) {
  return t == LayerType::FullAttention ? "full_attention" : "linear_attention";
}

int Qwen35Config::num_full_attention_layers() const {
  return int(std::count(layer_types.begin(), layer_types.end(), LayerType::FullAttention));
}

int Qwen35Config::num_linear_attention_layers() const {
  return int(std::count(layer_types.begin(), layer_types.end(), LayerType::LinearAttention));
}

Qwen35Config parse_qwen35_config(const nlohmann::json& j, const std::string& source) {
  const JsonFields root(j, source);
  Qwen35Config c;
  const std::optional<std::string> model_type = root.string("model_type");
  if (!model_type) fail("{} is missing", root.where("model_type"));
  c.outer_model_type = *model_type;

  // The text model's fields: the root itself, or text_config of the composite model (whose
  // vision_config is ignored: text-only inference never runs the vision tower).
  std::optional<JsonFields> text_holder;
  if (*model_type == "qwen3_5_moe") {
    text_holder = root.object("text_config");
    if (!text_holder) fail("{} is missing (model_type qwen3_5_moe)", root.where("text_config"));
    if (root.has("vision_config")) (void)root.object("vision_config");  // must be an object
  } else if (*model_type == "qwen3_5_moe_text") {
    text_holder = root;
  } else {
    fail("{} is '{}'; expected 'qwen3_5_moe' or 'qwen3_5_moe_text'", root.where("model_type"), *model_type);
  }
  const JsonFields& text = *text_holder;
  c.model_type = text.string("model_type").value_or("qwen3_5_moe_text");
  if (c.model_type != "qwen3_5_moe_text")
    fail("{} is '{}'; expected 'qwen3_5_moe_text'", text.where("model_type"), c.model_type);

  c.vocab_size = size_field(text, "vocab_size", 248320);
  c.hidden_size = size_field(text, "hidden_size", 2048);
  c.num_hidden_layers = size_field(text, "num_hidden_layers", 40);
  c.layer_types = parse_layer_types(text, c.num_hidden_layers);
  c.num_attention_heads = size_field(text, "num_attention_heads", 16);
  c.num_key_value_heads = size_field(text, "num_key_value_heads", 2);
  c.head_dim = size_field(text, "head_dim", 256);
  c.attention_bias = text.boolean("attention_bias").value_or(false);
  parse_rope(text, c);
  c.linear_num_key_heads = size_field(text, "linear_num_key_heads", 16);
  c.linear_num_value_heads = size_field(text, "linear_num_value_heads", 32);
  c.linear_key_head_dim = size_field(text, "linear_key_head_dim", 128);
  c.linear_value_head_dim = size_field(text, "linear_value_head_dim", 128);
  c.linear_conv_kernel_dim = size_field(text, "linear_conv_kernel_dim", 4);
  c.num_experts = size_field(text, "num_experts", 256);
  c.num_experts_per_tok = size_field(text, "num_experts_per_tok", 8);
  c.moe_intermediate_size = size_field(text, "moe_intermediate_size", 512);
  c.shared_expert_intermediate_size = size_field(text, "shared_expert_intermediate_size", 512);
  c.rms_norm_eps = text.number("rms_norm_eps").value_or(1e-6);
  c.hidden_act = text.string("hidden_act").value_or("silu");
  c.max_position_embeddings = size_field(text, "max_position_embeddings", 32768);
  c.mtp_num_hidden_layers = text.integer("mtp_num_hidden_layers").value_or(0);
  c.mtp_use_dedicated_embeddings = text.boolean("mtp_use_dedicated_embeddings").value_or(false);

  // In the composite config these may sit at the top level as well; the text config wins.
  auto text_or_root_bool = [&](const char* key, bool fallback) {
    if (auto v = text.boolean(key)) return *v;
    return root.boolean(key).value_or(fallback);
  };
  c.tie_word_embeddings = text_or_root_bool("tie_word_embeddings", false);
  c.eos_token_ids = parse_eos(text);
  if (c.eos_token_ids.empty() && *model_type == "qwen3_5_moe") c.eos_token_ids = parse_eos(root);

  // quantization_config lives at the top level (also checked in text_config).
  if (const nlohmann::json* q = root.find("quantization_config"))
    c.quantization = parse_quantization_config(*q, source);
  else if (const nlohmann::json* tq = text.find("quantization_config"))
    c.quantization = parse_quantization_config(*tq, source, "text_config.quantization_config");

  validate(c, text);
  return c;
}

Qwen35Config load_qwen35_config(const std::filesystem::path& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path path = model_dir / "config.json";
  if (fs::is_regular_file(model_dir, ec))
    path = model_dir.extension() == ".json" ? model_dir : model_dir.parent_path() / "config.json";
  const std::string text = read_file_text(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
  return parse_qwen35_config(j, path.string());
}

}  // namespace moeserve::io
