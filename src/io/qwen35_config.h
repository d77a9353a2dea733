// The text model's hyper-parameters, parsed from a Hugging Face config.json in either
// form: text-only (model_type "qwen3_5_moe_text") or composite ("qwen3_5_moe" with the
// values under "text_config"). ../shared/spec/qwen35_arch.md section 1.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::io {

enum class LayerType { LinearAttention, FullAttention };

// quantization_config as published (section 4); absent means unquantised.
struct QuantizationConfig {
  std::string quant_method;           // "", "auto-round", "gptq", "fp8", "compressed-tensors", "modelopt"
  int bits = 0;                       // 4 for INT4
  int group_size = 0;                 // INT4 / NVFP4 group along K
  bool sym = true;
  std::string packing_format;         // "auto_round:auto_gptq"
  std::vector<int> weight_block_size; // FP8: [128, 128]
  std::vector<std::string> modules_to_not_convert;
  nlohmann::json raw;                 // the whole object (extra_config, config_groups, ...)
};

struct Qwen35Config {
  std::string model_type;  // of the text config: "qwen3_5_moe_text"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;               // H
  int64_t num_hidden_layers = 0;         // L
  std::vector<LayerType> layer_types;    // size L
  // Gated full attention
  int64_t num_attention_heads = 0;       // nq
  int64_t num_key_value_heads = 0;       // nkv
  int64_t head_dim = 0;                  // hd
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;   // rotary dim = head_dim * factor
  std::vector<int> mrope_section;        // text-only: reduces to 1-D positions
  bool mrope_interleaved = false;
  // RoPE scaling: "default" (none), or "linear", "dynamic", "yarn", "longrope", "llama3" with
  // `rope_scaling_factor` and `original_max_position_embeddings` (0 when absent). The model
  // rejects types it does not implement; the full rope object is kept in rope_parameters_raw.
  std::string rope_type = "default";
  double rope_scaling_factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  nlohmann::json rope_parameters_raw;
  bool attention_bias = false;           // q/k/v/o biases (false in every Qwen3.5 release)
  // Gated DeltaNet
  int64_t linear_num_key_heads = 0;      // nk
  int64_t linear_num_value_heads = 0;    // nv
  int64_t linear_key_head_dim = 0;       // dk
  int64_t linear_value_head_dim = 0;     // dv
  int64_t linear_conv_kernel_dim = 4;
  // MoE
  int64_t num_experts = 0;               // E
  int64_t num_experts_per_tok = 0;       // k
  int64_t moe_intermediate_size = 0;     // I
  int64_t shared_expert_intermediate_size = 0;  // Is
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  int64_t mtp_num_hidden_layers = 0;
  bool mtp_use_dedicated_embeddings = false;
  std::vector<int64_t> eos_token_ids;
  std::string outer_model_type;          // top-level model_type: "qwen3_5_moe" or "qwen3_5_moe_text"
  std::optional<QuantizationConfig> quantization;

  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor); }
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int num_full_attention_layers() const;
  int num_linear_attention_layers() const;
};

// Parses and validates (every size positive, heads divisible, layer_types consistent, ...).
// Errors name the file and the field. Absent fields take the defaults of transformers'
// Qwen3_5MoeTextConfig.
Qwen35Config parse_qwen35_config(const nlohmann::json& j, const std::string& source = "config.json");
// Reads MODEL_DIR/config.json (a path to a .json file is read directly).
Qwen35Config load_qwen35_config(const std::filesystem::path& model_dir);
std::string_view layer_type_name(LayerType t);  // "linear_attention" / "full_attention"
// Parses a quantization_config object (section 4): the common fields of auto-round/GPTQ,
// FP8 block, compressed-tensors and ModelOpt into QuantizationConfig, keeping the object in
// `raw`. `field` is its path for messages ("quantization_config").
QuantizationConfig parse_quantization_config(const nlohmann::json& j, const std::string& source,
                                             const std::string& field = "quantization_config");

}  // namespace moeserve::io
