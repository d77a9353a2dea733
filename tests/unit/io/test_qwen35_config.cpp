// config.json parsing. Expected values come from ../shared/spec/qwen35_arch.md section 1.1
// (the published 122B-A10B config) and transformers' Qwen3_5MoeTextConfig defaults (the
// 35B-A3B shape, section 6).
#include <gtest/gtest.h>

#include "io/qwen35_config.h"
#include "io_test_util.h"

namespace moeserve::io {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::TempDir;
using testing::write_file;

// text_config of Qwen3.5-122B-A10B as published (spec 1.1).
json text_122b() {
  return json::parse(R"({
    "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 3072,
    "num_hidden_layers": 48, "full_attention_interval": 4, "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 64, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 1024, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": false, "eos_token_id": 248044, "attention_bias": false,
    "tie_word_embeddings": false,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": true}
  })");
}

json composite_122b() {
  json j = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
            {"model_type", "qwen3_5_moe"},
            {"tie_word_embeddings", false},
            {"image_token_id", 248056},
            {"text_config", text_122b()},
            {"vision_config", {{"depth", 27}, {"hidden_size", 1152}, {"out_hidden_size", 3072}}}};
  return j;
}

TEST(Qwen35Config, Composite122B) {
  const Qwen35Config c = parse_qwen35_config(composite_122b(), "122b/config.json");
  EXPECT_EQ(c.outer_model_type, "qwen3_5_moe");
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.hidden_size, 3072);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rope_type, "default");
  EXPECT_EQ(c.mrope_section, (std::vector<int>{11, 11, 10}));
  EXPECT_TRUE(c.mrope_interleaved);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 1024);
  EXPECT_EQ(c.shared_expert_intermediate_size, 1024);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{248044}));
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.quantization.has_value());
  // Derived dimensions, spec 1.2.
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.linear_key_dim(), 2048);
  EXPECT_EQ(c.linear_value_dim(), 8192);
  EXPECT_EQ(c.linear_conv_dim(), 12288);
  EXPECT_EQ(c.num_full_attention_layers(), 12);
  EXPECT_EQ(c.num_linear_attention_layers(), 36);
  ASSERT_EQ(c.layer_types.size(), 48u);
  for (int i = 0; i < 48; ++i)
    EXPECT_EQ(c.layer_types[i], i % 4 == 3 ? LayerType::FullAttention : LayerType::LinearAttention) << i;
  EXPECT_EQ(layer_type_name(c.layer_types[3]), "full_attention");
}

TEST(Qwen35Config, TextOnlyWithExplicitLayerTypes) {
  json j = text_122b();
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "linear_attention", "full_attention"};
  j["eos_token_id"] = {248046, 248044};
  const Qwen35Config c = parse_qwen35_config(j);
  EXPECT_EQ(c.outer_model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.layer_types, (std::vector<LayerType>{LayerType::FullAttention, LayerType::LinearAttention,
                                                   LayerType::FullAttention}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{248046, 248044}));
}

TEST(Qwen35Config, AbsentFieldsTakeTransformersDefaults) {
  // Qwen3_5MoeTextConfig() is the 35B-A3B shape (spec 1.1 / 6).
  const Qwen35Config c = parse_qwen35_config(json{{"model_type", "qwen3_5_moe_text"}, {"head_dim", nullptr}});
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 32);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.mtp_num_hidden_layers, 0);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.num_full_attention_layers(), 10);  // interval 4 over 40 layers
}

TEST(Qwen35Config, FullAttentionIntervalRule) {
  json j = text_122b();
  j["num_hidden_layers"] = 7;
  j["full_attention_interval"] = 3;
  const Qwen35Config c = parse_qwen35_config(j);
  // (i + 1) % 3 == 0 -> layers 2 and 5.
  std::vector<LayerType> expected(7, LayerType::LinearAttention);
  expected[2] = expected[5] = LayerType::FullAttention;
  EXPECT_EQ(c.layer_types, expected);
}

TEST(Qwen35Config, LegacyRopeFields) {
  json j = text_122b();
  j.erase("rope_parameters");
  j["rope_theta"] = 5e6;
  j["partial_rotary_factor"] = 0.5;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 262144},
                       {"mrope_section", {22, 21, 21}}};
  const Qwen35Config c = parse_qwen35_config(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.5);
  EXPECT_EQ(c.rotary_dim(), 128);
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling_factor, 4.0);
  EXPECT_EQ(c.original_max_position_embeddings, 262144);
  EXPECT_EQ(c.mrope_section, (std::vector<int>{22, 21, 21}));
  EXPECT_EQ(c.rope_parameters_raw["factor"], 4.0);
}

TEST(Qwen35Config, RopeParametersWinOverLegacyFields) {
  json j = text_122b();
  j["rope_theta"] = 1.0;  // ignored: rope_parameters says 1e7
  EXPECT_DOUBLE_EQ(parse_qwen35_config(j).rope_theta, 1e7);
}

TEST(Qwen35Config, QuantizationConfigs) {
  json j = composite_122b();
  j["quantization_config"] = json::parse(R"({"quant_method": "auto-round", "packing_format": "auto_round:auto_gptq",
      "bits": 4, "group_size": 128, "sym": true, "data_type": "int",
      "extra_config": {"model.language_model.layers.0.mlp.shared_expert_gate": {"bits": 16}}})");
  Qwen35Config c = parse_qwen35_config(j);
  ASSERT_TRUE(c.quantization);
  EXPECT_EQ(c.quantization->quant_method, "auto-round");
  EXPECT_EQ(c.quantization->bits, 4);
  EXPECT_EQ(c.quantization->group_size, 128);
  EXPECT_TRUE(c.quantization->sym);
  EXPECT_EQ(c.quantization->packing_format, "auto_round:auto_gptq");
  EXPECT_EQ(c.quantization->raw["extra_config"].size(), 1u);

  j["quantization_config"] = json::parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
      "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "mlp.gate"]})");
  c = parse_qwen35_config(j);
  EXPECT_EQ(c.quantization->quant_method, "fp8");
  EXPECT_EQ(c.quantization->weight_block_size, (std::vector<int>{128, 128}));
  EXPECT_EQ(c.quantization->modules_to_not_convert, (std::vector<std::string>{"lm_head", "mlp.gate"}));

  j["quantization_config"] = json::parse(R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float",
      "strategy": "tensor_group", "group_size": 16, "symmetric": true}}}, "ignore": ["lm_head", "re:.*mlp.gate$"]})");
  c = parse_qwen35_config(j);
  EXPECT_EQ(c.quantization->quant_method, "compressed-tensors");
  EXPECT_EQ(c.quantization->bits, 4);
  EXPECT_EQ(c.quantization->group_size, 16);
  EXPECT_EQ(c.quantization->modules_to_not_convert, (std::vector<std::string>{"lm_head", "re:.*mlp.gate$"}));

  j["quantization_config"] = json::parse(R"({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
      "exclude_modules": ["lm_head"]})");
  c = parse_qwen35_config(j);
  EXPECT_EQ(c.quantization->bits, 4);
  EXPECT_EQ(c.quantization->group_size, 16);
  EXPECT_EQ(c.quantization->modules_to_not_convert, (std::vector<std::string>{"lm_head"}));
}

// Each invalid config is an error naming the file and the field.
struct BadCase {
  const char* what;
  std::function<void(json&)> edit;  // applied to the text-only 122B config
  std::vector<std::string> message;
};

TEST(Qwen35Config, InvalidConfigsNameFileAndField) {
  const std::vector<BadCase> cases = {
      {"size as string", [](json& j) { j["hidden_size"] = "3072"; }, {"hidden_size must be an integer", "string"}},
      {"size as float", [](json& j) { j["hidden_size"] = 3072.5; }, {"hidden_size must be an integer"}},
      {"zero size", [](json& j) { j["num_experts"] = 0; }, {"num_experts must be positive"}},
      {"negative size", [](json& j) { j["head_dim"] = -2; }, {"head_dim must be positive"}},
      {"huge size", [](json& j) { j["vocab_size"] = int64_t(1) << 40; }, {"vocab_size", "implausibly large"}},
      {"heads not divisible", [](json& j) { j["num_key_value_heads"] = 3; },
       {"num_attention_heads (32)", "num_key_value_heads (3)"}},
      {"linear heads not divisible", [](json& j) { j["linear_num_value_heads"] = 40; j["linear_num_key_heads"] = 16; },
       {"linear_num_value_heads (40)", "linear_num_key_heads (16)"}},
      {"top-k above experts", [](json& j) { j["num_experts_per_tok"] = 300; }, {"num_experts_per_tok (300)", "num_experts (256)"}},
      {"layer_types length", [](json& j) { j["layer_types"] = {"full_attention"}; },
       {"layer_types has 1 entries", "num_hidden_layers is 48"}},
      {"unknown layer type", [](json& j) {
         j["num_hidden_layers"] = 2;
         j["layer_types"] = {"full_attention", "sliding_attention"};
       }, {"layer_types[1]", "'sliding_attention'"}},
      {"layer_types not strings", [](json& j) { j["layer_types"] = {1, 2}; }, {"layer_types must be a list of strings"}},
      {"interval zero", [](json& j) { j["full_attention_interval"] = 0; }, {"full_attention_interval must be positive"}},
      {"odd rotary dim", [](json& j) {
         j["head_dim"] = 12;
         j["rope_parameters"].erase("mrope_section");
       }, {"rotary dim", "12 * 0.25"}},
      {"rotary factor above 1", [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 1.5; },
       {"rope_parameters.partial_rotary_factor", "(0, 1]"}},
      {"negative theta", [](json& j) { j["rope_parameters"]["rope_theta"] = -1; }, {"rope_parameters.rope_theta", "positive"}},
      {"mrope sum", [](json& j) { j["rope_parameters"]["mrope_section"] = {11, 11, 11}; }, {"mrope_section sums to 33", "32 frequencies"}},
      {"unknown rope type", [](json& j) { j["rope_parameters"]["rope_type"] = "spiral"; }, {"unknown rope_type 'spiral'"}},
      {"rope_parameters not object", [](json& j) { j["rope_parameters"] = 3; }, {"rope_parameters must be an object"}},
      {"eos negative", [](json& j) { j["eos_token_id"] = {1, -5}; }, {"eos_token_id", "-5"}},
      {"eos string", [](json& j) { j["eos_token_id"] = "2"; }, {"eos_token_id must be an integer"}},
      {"act", [](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "'gelu'"}},
      {"eps", [](json& j) { j["rms_norm_eps"] = 0; }, {"rms_norm_eps", "(0, 1)"}},
      {"bool field", [](json& j) { j["tie_word_embeddings"] = "no"; }, {"tie_word_embeddings must be true or false"}},
      {"unknown model type", [](json& j) { j["model_type"] = "qwen3_moe"; }, {"model_type is 'qwen3_moe'"}},
      {"missing model type", [](json& j) { j.erase("model_type"); }, {"model_type is missing"}},
      {"quant without method", [](json& j) { j["quantization_config"] = {{"bits", 4}}; },
       {"quantization_config.quant_method is missing"}},
      {"quant block size", [](json& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128}}};
       }, {"quantization_config.weight_block_size", "two positive integers"}},
  };
  for (const BadCase& bad : cases) {
    json j = text_122b();
    bad.edit(j);
    std::vector<std::string> parts = {"m/config.json"};
    parts.insert(parts.end(), bad.message.begin(), bad.message.end());
    SCOPED_TRACE(bad.what);
    expect_error([&] { parse_qwen35_config(j, "m/config.json"); }, parts);
  }
}

TEST(Qwen35Config, CompositeErrorsNameTheTextConfigPath) {
  json j = composite_122b();
  j["text_config"]["num_experts"] = "many";
  expect_error([&] { parse_qwen35_config(j, "c.json"); }, {"c.json: text_config.num_experts must be an integer"});
  j = composite_122b();
  j.erase("text_config");
  expect_error([&] { parse_qwen35_config(j, "c.json"); }, {"c.json: text_config is missing"});
  j = composite_122b();
  j["text_config"]["model_type"] = "qwen3_next";
  expect_error([&] { parse_qwen35_config(j, "c.json"); }, {"text_config.model_type is 'qwen3_next'"});
  j = composite_122b();
  j["vision_config"] = 1;
  expect_error([&] { parse_qwen35_config(j, "c.json"); }, {"c.json: vision_config must be an object"});
  expect_error([&] { parse_qwen35_config(json::array(), "c.json"); }, {"c.json", "JSON object"});
}

TEST(Qwen35Config, LoadsFromADirectory) {
  TempDir dir;
  write_file(dir / "config.json", composite_122b().dump(2));
  EXPECT_EQ(load_qwen35_config(dir.path()).hidden_size, 3072);
  EXPECT_EQ(load_qwen35_config(dir / "config.json").hidden_size, 3072);
  expect_error([&] { load_qwen35_config(dir / "absent"); }, {"cannot open", "absent/config.json"});
  write_file(dir / "config.json", "{\"model_type\": ");
  expect_error([&] { load_qwen35_config(dir.path()); }, {"config.json", "not valid JSON"});
}

}  // namespace
}  // namespace moeserve::io
