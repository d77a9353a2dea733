// QuantScheme: which quantization_config methods and variants are accepted, AutoRound
// extra_config overrides (exact names in any prefix form, regexes), and the per-flavour
// matching of the lists of unquantised modules.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "quant/quant_config.h"
#include "quant_test_util.h"

namespace moeserve::quant {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;
using nlohmann::json;

QuantScheme scheme(const json& j) { return QuantScheme(io::parse_quantization_config(j, "config.json"), "config.json"); }

std::string scheme_error(const json& j) {
  try {
    scheme(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ModuleNames names(const std::string& canonical) { return {canonical, "model.language_model." + canonical}; }

const json kAutoRound = {{"quant_method", "auto-round"}, {"packing_format", "auto_round:auto_gptq"},
                         {"bits", 4},                    {"group_size", 128},
                         {"sym", true},                  {"data_type", "int"}};

TEST(QuantScheme, UnsupportedMethodsAndVariantsAreNamed) {
  EXPECT_THAT(scheme_error({{"quant_method", "awq"}, {"bits", 4}}),
              AllOf(HasSubstr("config.json: quantization_config.quant_method"), HasSubstr("'awq' is not supported")));
  json j = kAutoRound;
  j["bits"] = 8;
  EXPECT_THAT(scheme_error(j), AllOf(HasSubstr("quantization_config.bits"), HasSubstr("8-bit")));
  j = kAutoRound;
  j["packing_format"] = "auto_round:auto_awq";
  EXPECT_THAT(scheme_error(j), AllOf(HasSubstr("packing_format"), HasSubstr("auto_round:auto_awq")));
  j = kAutoRound;
  j["data_type"] = "nv_fp";
  EXPECT_THAT(scheme_error(j), HasSubstr("data_type"));
  EXPECT_THAT(scheme_error({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"checkpoint_format", "gptq_v2"}}),
              HasSubstr("'gptq_v2' is not supported"));
  EXPECT_THAT(scheme_error({{"quant_method", "fp8"}, {"fmt", "e5m2"}}), HasSubstr("'e5m2' is not supported"));
  EXPECT_THAT(scheme_error({{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}}),
              HasSubstr("'pack-quantized' is not supported"));
  EXPECT_THAT(scheme_error({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}}), HasSubstr("'FP8' is not supported"));
  EXPECT_THAT(scheme_error({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 32}}),
              HasSubstr("group size 32"));
  json extra = kAutoRound;
  extra["extra_config"] = {{"layers.0.mlp.gate", 16}};
  EXPECT_THAT(scheme_error(extra), HasSubstr("extra_config.layers.0.mlp.gate must be an object"));
  extra["extra_config"] = {{"layers.(", {{"bits", 16}}}};
  EXPECT_THAT(scheme_error(extra), HasSubstr("not a valid regular expression"));
}

TEST(QuantScheme, NoConfigLeavesEverythingToTheTensors) {
  const QuantScheme none;
  EXPECT_FALSE(none.has_config());
  EXPECT_FALSE(none.int4_params(names("layers.0.mlp.experts.0.up_proj")).has_value());
  EXPECT_EQ(none.fp8_block().rows, 128);
  EXPECT_EQ(none.fp8_block().cols, 128);
  EXPECT_FALSE(none.excluded_by(names("lm_head")).has_value());
  // An FP8 config gives no INT4 parameters either (a hybrid written under it).
  EXPECT_FALSE(scheme({{"quant_method", "fp8"}}).int4_params(names("layers.0.mlp.experts.0.up_proj")).has_value());
  const QuantScheme fp8 = scheme({{"quant_method", "fp8"}, {"weight_block_size", {64, 32}}});
  EXPECT_EQ(fp8.fp8_block().rows, 64);
  EXPECT_EQ(fp8.fp8_block().cols, 32);
}

TEST(QuantScheme, AutoRoundExtraConfigOverridesByExactNameOrRegex) {
  json j = kAutoRound;
  j["extra_config"] = {
      {"model.language_model.layers.3.mlp.experts.1.up_proj", {{"group_size", 64}, {"sym", false}}},
      {"model.layers.0.mlp.shared_expert_gate", {{"bits", 16}, {"data_type", "fp"}}},
      {"mlp\\.experts\\.[0-9]+\\.down_proj", {{"group_size", 32}}},
      {".*linear_attn.in_proj_[ab]$", {{"bits", 16}}},
      {"layers.2.self_attn.o_proj", {{"bits", 8}}}};
  const QuantScheme s = scheme(j);
  const auto base = s.int4_params(names("layers.3.mlp.experts.1.gate_proj"));
  ASSERT_TRUE(base);
  EXPECT_EQ(base->group_size, 128);
  EXPECT_TRUE(base->sym);
  const auto exact = s.int4_params(names("layers.3.mlp.experts.1.up_proj"));  // key in another prefix form
  EXPECT_EQ(exact->group_size, 64);
  EXPECT_FALSE(exact->sym);
  EXPECT_EQ(s.int4_params(names("layers.7.mlp.experts.12.down_proj"))->group_size, 32);
  EXPECT_EQ(s.excluded_by(names("layers.0.mlp.shared_expert_gate")),
            "extra_config 'model.layers.0.mlp.shared_expert_gate' (bits 16)");
  EXPECT_EQ(s.excluded_by(names("layers.4.linear_attn.in_proj_a")), "extra_config '.*linear_attn.in_proj_[ab]$' (bits 16)");
  EXPECT_FALSE(s.excluded_by(names("layers.4.linear_attn.in_proj_qkv")).has_value());
  EXPECT_FALSE(s.excluded_by(names("layers.3.mlp.experts.1.up_proj")).has_value());
  try {
    s.int4_params(names("layers.0.mlp.shared_expert_gate"));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("stored as INT4"), HasSubstr("16 bits")));
  }
  EXPECT_THROW(s.int4_params(names("layers.2.self_attn.o_proj")), Error);
}

TEST(QuantScheme, Fp8ModulesToNotConvertMatchWholePathComponents) {
  const QuantScheme s = scheme({{"quant_method", "fp8"},
                                {"weight_block_size", {128, 128}},
                                {"modules_to_not_convert", {"lm_head", "mlp.gate", "shared_expert_gate", "layers.1"}}});
  EXPECT_EQ(s.excluded_by(names("layers.0.mlp.gate")), "modules_to_not_convert 'mlp.gate'");
  EXPECT_EQ(s.excluded_by(ModuleNames{"lm_head", "lm_head"}), "modules_to_not_convert 'lm_head'");
  EXPECT_EQ(s.excluded_by(names("layers.1.self_attn.q_proj")), "modules_to_not_convert 'layers.1'");
  EXPECT_TRUE(s.excluded_by(names("layers.0.mlp.shared_expert_gate")).has_value());
  EXPECT_FALSE(s.excluded_by(names("layers.0.mlp.experts.0.gate_proj")).has_value());
  EXPECT_FALSE(s.excluded_by(names("layers.0.mlp.shared_expert.gate_proj")).has_value());
  EXPECT_FALSE(s.excluded_by(names("layers.11.self_attn.q_proj")).has_value());
}

TEST(QuantScheme, CompressedTensorsIgnoreIsExactOrReMatch) {
  const QuantScheme s = scheme({{"quant_method", "compressed-tensors"},
                                {"format", "nvfp4-pack-quantized"},
                                {"config_groups", {{"group_0", {{"weights", {{"num_bits", 4}, {"group_size", 16}}}}}}},
                                {"ignore", {"lm_head", "re:.*mlp.gate$", "re:.*linear_attn.*"}}});
  EXPECT_EQ(s.excluded_by(names("layers.0.mlp.gate")), "ignore 're:.*mlp.gate$'");
  EXPECT_FALSE(s.excluded_by(names("layers.0.mlp.experts.0.gate_proj")).has_value());
  EXPECT_TRUE(s.excluded_by(names("layers.2.linear_attn.out_proj")).has_value());
  EXPECT_TRUE(s.excluded_by(ModuleNames{"lm_head", "lm_head"}).has_value());
  // Exact names only outside "re:": "lm_head" does not cover "lm_head_extra".
  EXPECT_FALSE(s.excluded_by(ModuleNames{"lm_head_extra", "lm_head_extra"}).has_value());
}

TEST(QuantScheme, ModelOptExcludeModulesAreGlobs) {
  const QuantScheme s = scheme({{"quant_method", "modelopt"},
                                {"quant_algo", "NVFP4"},
                                {"group_size", 16},
                                {"exclude_modules", {"lm_head", "*mlp.gate", "*linear_attn*"}}});
  EXPECT_EQ(s.excluded_by(names("layers.0.mlp.gate")), "exclude_modules '*mlp.gate'");
  EXPECT_FALSE(s.excluded_by(names("layers.0.mlp.gate_up")).has_value());
  EXPECT_TRUE(s.excluded_by(names("layers.2.linear_attn.in_proj_qkv")).has_value());
  EXPECT_FALSE(s.excluded_by(names("layers.3.self_attn.q_proj")).has_value());
}

}  // namespace
}  // namespace moeserve::quant
