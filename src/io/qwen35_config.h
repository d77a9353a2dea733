// The text model's hyper-parameters, parsed from a Hugging Face config.json in either
// form: text-only (model_type "qwen3_5_moe_text") or composite ("qwen3_5_moe" with the
// values under "text_config"). ../shared/spec/qwen35_arch.md section 1.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
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
  std::vector<int64_t> eos_token_ids;
  std::optional<QuantizationConfig> quantization;

  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor); }
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int num_full_attention_layers() const;
  int num_linear_attention_layers() const;
};

// Parses and validates (every size positive, heads divisible, layer_types consistent, ...).
// Errors name the file and the field.
Qwen35Config parse_qwen35_config(const nlohmann::json& j, const std::string& source = "config.json");
Qwen35Config load_qwen35_config(const std::filesystem::path& model_dir);

}  // namespace moeserve::io
