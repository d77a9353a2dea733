// The conversion planner, shard assignment, size parsing and quantization_config contents, on
// planned tensor lists (no data): which module goes to which format, the output tensors' names,
// dtypes and shapes, and every planning error.
#include <gtest/gtest.h>

#include <set>

#include "convert_test_util.h"
#include "core/error.h"
#include "tools/convert_config.h"
#include "tools/convert_plan.h"
#include "tools/convert_shards.h"
#include "tools/convert_source.h"

namespace moeserve::tools {
namespace {

// 4 layers (3 DeltaNet + 1 attention), 4 experts, MTP: H = 64, I = Is = 32.
io::Qwen35Config small_config(int64_t mtp_layers = 1) {
  return io::parse_qwen35_config(nlohmann::json{
      {"model_type", "qwen3_5_moe_text"}, {"vocab_size", 100}, {"hidden_size", 64}, {"num_hidden_layers", 4},
      {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 16}, {"linear_num_key_heads", 1},
      {"linear_num_value_heads", 2}, {"linear_key_head_dim", 16}, {"linear_value_head_dim", 16},
      {"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32},
      {"shared_expert_intermediate_size", 32}, {"mtp_num_hidden_layers", mtp_layers},
      {"rope_parameters", {{"rope_theta", 10000}, {"partial_rotary_factor", 0.25}}}});
}

struct PlanView {
  std::map<std::string, std::pair<DType, Shape>> outputs;  // by output name
  const ConvertPlan plan;
  explicit PlanView(ConvertPlan p) : plan(std::move(p)) {
    for (const PlanItem& item : plan.items)
      for (const OutputTensor& o : item.outputs) outputs[o.name] = {o.dtype, o.shape};
  }
  bool has(const std::string& name) const { return outputs.count(name) != 0; }
  DType dtype(const std::string& name) const { return outputs.at(name).first; }
  const Shape& shape(const std::string& name) const { return outputs.at(name).second; }
};

PlanView plan(const std::vector<SourceTensor>& tensors, WeightsMode mode, std::optional<std::string> regex = {},
              int64_t group = 32) {
  return PlanView(plan_conversion(tensors, PlanOptions{mode, regex, group}));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LinearRole, FromCanonicalNames) {
  EXPECT_EQ(linear_role("layers.0.mlp.experts.3.gate_proj"), LinearRole::RoutedExpert);
  EXPECT_EQ(linear_role("mtp.layers.0.mlp.experts.0.down_proj"), LinearRole::RoutedExpert);
  EXPECT_EQ(linear_role("layers.3.self_attn.q_proj"), LinearRole::AttentionProj);
  EXPECT_EQ(linear_role("layers.3.self_attn.o_proj"), LinearRole::AttentionProj);
  EXPECT_EQ(linear_role("layers.0.linear_attn.in_proj_qkv"), LinearRole::DeltaNetProj);
  EXPECT_EQ(linear_role("layers.0.linear_attn.out_proj"), LinearRole::DeltaNetProj);
  EXPECT_EQ(linear_role("layers.0.linear_attn.in_proj_a"), LinearRole::DeltaNetGate);
  EXPECT_EQ(linear_role("layers.0.mlp.shared_expert.down_proj"), LinearRole::SharedExpert);
  EXPECT_EQ(linear_role("layers.0.mlp.shared_expert_gate"), LinearRole::SharedExpertGate);
  EXPECT_EQ(linear_role("layers.0.mlp.gate"), LinearRole::Router);
  EXPECT_EQ(linear_role("lm_head"), LinearRole::LmHead);
  EXPECT_EQ(linear_role("mtp.fc"), LinearRole::MtpFc);
  EXPECT_EQ(weights_mode_name(parse_weights_mode("hybrid-int4-fp8")), "hybrid-int4-fp8");
  EXPECT_NE(error_of([] { parse_weights_mode("int4"); }).find("unknown --weights 'int4'"), std::string::npos);
}

TEST(ConvertPlan, KeepCopiesEveryTensorUnchanged) {
  const auto tensors = reference_bf16_tensors(small_config());
  const PlanView v = plan(tensors, WeightsMode::Keep);
  ASSERT_EQ(v.plan.items.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(v.plan.items[i].action, PlanItem::Action::Copy);
    EXPECT_EQ(v.plan.items[i].outputs.at(0).name, tensors[i].name);
    EXPECT_EQ(v.plan.items[i].outputs.at(0).shape, tensors[i].shape());
  }
  EXPECT_EQ(v.plan.fused_tensors_split, 0);
  EXPECT_TRUE(v.plan.int4_modules.empty());
  EXPECT_EQ(v.plan.source_bytes, v.plan.output_bytes);
}

TEST(ConvertPlan, Int4DefaultSetSplitsFusedExpertsAndKeepsTheRest) {
  const PlanView v = plan(reference_bf16_tensors(small_config()), WeightsMode::GptqInt4);
  // Routed experts, per expert, in every layer and the MTP layer: qweight [K/8, N], qzeros, scales.
  for (const std::string p : {"model.layers.0.mlp.experts.3.", "mtp.layers.0.mlp.experts.0."}) {
    EXPECT_EQ(v.shape(p + "gate_proj.qweight"), (Shape{8, 32}));
    EXPECT_EQ(v.dtype(p + "gate_proj.qweight"), DType::I32);
    EXPECT_EQ(v.shape(p + "gate_proj.qzeros"), (Shape{2, 4}));
    EXPECT_EQ(v.shape(p + "gate_proj.scales"), (Shape{2, 32}));
    EXPECT_EQ(v.dtype(p + "gate_proj.scales"), DType::F16);
    EXPECT_EQ(v.shape(p + "down_proj.qweight"), (Shape{4, 64}));
  }
  EXPECT_FALSE(v.has("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(v.plan.fused_tensors_split, 2 * 5);
  EXPECT_TRUE(v.has("model.layers.3.self_attn.q_proj.qweight"));
  EXPECT_TRUE(v.has("model.layers.0.linear_attn.in_proj_qkv.qweight"));
  EXPECT_TRUE(v.has("model.layers.0.linear_attn.out_proj.qweight"));
  EXPECT_TRUE(v.has("model.layers.1.mlp.shared_expert.up_proj.qweight"));
  // Kept as stored.
  for (const char* kept : {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.gate.weight",
                           "model.layers.0.mlp.shared_expert_gate.weight", "model.layers.0.linear_attn.in_proj_a.weight",
                           "model.layers.0.linear_attn.in_proj_b.weight", "model.layers.0.linear_attn.conv1d.weight",
                           "model.layers.0.linear_attn.A_log", "mtp.fc.weight", "model.norm.weight"})
    EXPECT_TRUE(v.has(kept)) << kept;
  EXPECT_EQ(v.dtype("model.layers.0.linear_attn.A_log"), DType::F32);
  // Modules by format: 5 MoE layers x 4 experts x 3 + 3 GDN x 3 + 2 attention x 4 + 5 shared x 3.
  EXPECT_EQ(v.plan.int4_modules.size(), size_t(60 + 9 + 8 + 15));
  EXPECT_TRUE(v.plan.fp8_modules.empty());
  const std::set<std::string> dense(v.plan.dense_modules.begin(), v.plan.dense_modules.end());
  EXPECT_EQ(dense.size(), size_t(5 * 2 + 3 * 2 + 1 + 1));  // router + shared gate, in_proj_a/b, mtp.fc, lm_head
  EXPECT_TRUE(dense.count("model.layers.2.linear_attn.in_proj_b"));
  EXPECT_TRUE(dense.count("lm_head"));
  EXPECT_TRUE(dense.count("mtp.fc"));
  EXPECT_LT(v.plan.output_bytes, v.plan.source_bytes);
}

TEST(ConvertPlan, HybridPutsExpertsInInt4AndDenseProjectionsInFp8) {
  const PlanView v = plan(reference_bf16_tensors(small_config()), WeightsMode::HybridInt4Fp8);
  EXPECT_TRUE(v.has("model.layers.2.mlp.experts.1.up_proj.qweight"));
  EXPECT_TRUE(v.has("mtp.layers.0.mlp.experts.1.up_proj.qweight"));
  for (const std::string m : {"model.layers.3.self_attn.k_proj", "model.layers.0.linear_attn.in_proj_z",
                              "model.layers.0.mlp.shared_expert.gate_proj", "mtp.layers.0.self_attn.o_proj"}) {
    EXPECT_EQ(v.dtype(m + ".weight"), DType::F8_E4M3) << m;
    EXPECT_EQ(v.dtype(m + ".weight_scale_inv"), DType::F32) << m;
  }
  // FP8 scale grids are ceil(N/128) x ceil(K/128): q_proj [64, 64] -> [1, 1].
  EXPECT_EQ(v.shape("model.layers.3.self_attn.q_proj.weight_scale_inv"), (Shape{1, 1}));
  EXPECT_EQ(v.dtype("model.layers.0.mlp.gate.weight"), DType::BF16);
  EXPECT_EQ(v.plan.int4_modules.size(), 60u);
  EXPECT_EQ(v.plan.fp8_modules.size(), size_t(9 + 8 + 15));
}

TEST(ConvertPlan, Fp8ScaleGridsRoundUp) {
  io::Qwen35Config c = small_config(0);
  c.vocab_size = 300;
  std::vector<SourceTensor> tensors = reference_bf16_tensors(c);
  const PlanView v = plan(tensors, WeightsMode::Fp8Block, std::string("^lm_head$"));
  EXPECT_EQ(v.shape("lm_head.weight"), (Shape{300, 64}));
  EXPECT_EQ(v.shape("lm_head.weight_scale_inv"), (Shape{3, 1}));
  EXPECT_EQ(v.plan.fp8_modules, std::vector<std::string>{"lm_head"});
  EXPECT_EQ(v.plan.fused_tensors_split, 0);  // no expert selected: fused tensors stay fused
  EXPECT_TRUE(v.has("model.layers.0.mlp.experts.gate_up_proj"));
}

TEST(ConvertPlan, RegexSelectsModulesAndSplitsOnlyTheLayersItTouches) {
  const PlanView v = plan(reference_bf16_tensors(small_config()), WeightsMode::GptqInt4,
                          std::string("^layers\\.1\\.mlp\\.experts\\.2\\."));
  EXPECT_EQ(v.plan.int4_modules.size(), 3u);
  EXPECT_TRUE(v.has("model.layers.1.mlp.experts.2.down_proj.qweight"));
  // The other experts of layer 1 are written per expert, as stored (BF16).
  EXPECT_EQ(v.dtype("model.layers.1.mlp.experts.0.gate_proj.weight"), DType::BF16);
  EXPECT_EQ(v.shape("model.layers.1.mlp.experts.0.gate_proj.weight"), (Shape{32, 64}));
  EXPECT_EQ(v.shape("model.layers.1.mlp.experts.3.down_proj.weight"), (Shape{64, 32}));
  EXPECT_FALSE(v.has("model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(v.has("model.layers.0.mlp.experts.gate_up_proj"));  // untouched layers stay fused
  EXPECT_EQ(v.plan.fused_tensors_split, 2);
  // The split slabs point at the right rows: up_proj of expert e starts at row (2e + 1) * I.
  for (const PlanItem& item : v.plan.items)
    if (item.module == "layers.1.mlp.experts.3.up_proj") EXPECT_EQ(item.source_offset, uint64_t(7 * 32 * 64 * 2));
}

TEST(ConvertPlan, Errors) {
  const auto tensors = reference_bf16_tensors(small_config());
  EXPECT_NE(error_of([&] { plan(tensors, WeightsMode::GptqInt4, std::string("no_such_module")); })
                .find("--modules 'no_such_module' matches no Linear module"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan(tensors, WeightsMode::GptqInt4, std::string("norm")); }).find("matches no Linear"),
            std::string::npos);  // norms are not Linear modules
  EXPECT_NE(error_of([&] { plan(tensors, WeightsMode::Fp8Block, std::string("(")); })
                .find("is not a valid regular expression"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan(tensors, WeightsMode::HybridInt4Fp8, std::string("x")); })
                .find("--modules applies to --weights gptq-int4 and fp8-block"),
            std::string::npos);
  const std::string group = error_of([&] { plan(tensors, WeightsMode::GptqInt4, std::nullopt, 128); });
  EXPECT_NE(group.find("module 'layers.0.linear_attn.in_proj_qkv': in_features K = 64 is not divisible by the "
                       "group size 128"),
            std::string::npos)
      << group;
  // Routed experts only (down_proj has K = 32): group 64 fails on down_proj, naming it.
  const std::string down = error_of([&] { plan(tensors, WeightsMode::GptqInt4, std::string("experts"), 64); });
  EXPECT_NE(down.find("layers.0.mlp.experts.0.down_proj"), std::string::npos) << down;
  // A checkpoint holding one layer's experts both fused and per expert.
  std::vector<SourceTensor> both = tensors;
  SourceTensor extra = tensors.front();
  extra.name = "model.layers.0.mlp.experts.1.up_proj.weight";
  extra.canonical = "layers.0.mlp.experts.1.up_proj.weight";
  extra.view = Tensor(DType::BF16, {32, 64}, nullptr, nullptr);
  both.push_back(extra);
  EXPECT_NE(error_of([&] { plan(both, WeightsMode::GptqInt4); }).find("would hold the tensor"), std::string::npos);
}

TEST(ConvertShards, ParseSize) {
  EXPECT_EQ(parse_size("200KB"), 200'000u);
  EXPECT_EQ(parse_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_size("5gb"), 5'000'000'000u);
  EXPECT_EQ(parse_size("1.5MB"), 1'500'000u);
  EXPECT_EQ(parse_size("100MiB"), 104'857'600u);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("7B"), 7u);
  for (const char* bad : {"", "GB", "5 GB", "5XB", "1.2.3MB", "-5MB", "0", "0.0001B"})
    EXPECT_THROW(parse_size(bad), Error) << bad;
}

TEST(ConvertShards, SizesRespectedAndNamedLikeTransformers) {
  const auto tensors = reference_bf16_tensors(small_config());
  const PlanView v = plan(tensors, WeightsMode::GptqInt4);
  const uint64_t max = 20'000;
  const std::vector<Shard> shards = assign_shards(v.plan, max);
  ASSERT_GT(shards.size(), 2u);
  EXPECT_EQ(shards.front().file_name, fmt::format("model-00001-of-{:05d}.safetensors", shards.size()));
  size_t next = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    uint64_t bytes = 0;
    for (size_t i : shards[s].items) {
      EXPECT_EQ(i, next++);  // in order, no gaps
      for (const OutputTensor& o : v.plan.items[i].outputs) bytes += o.nbytes();
    }
    EXPECT_EQ(bytes, shards[s].tensor_bytes);
    // Over the limit only when one item alone is (the 100 x 64 BF16 embedding is 12800 bytes).
    if (bytes > max) EXPECT_EQ(shards[s].items.size(), 1u);
    // Greedy: the next shard's first item would not have fitted.
    if (s + 1 < shards.size()) {
      uint64_t first = 0;
      for (const OutputTensor& o : v.plan.items[shards[s + 1].items.front()].outputs) first += o.nbytes();
      EXPECT_GT(bytes + first, max);
    }
  }
  EXPECT_EQ(next, v.plan.items.size());
  const nlohmann::ordered_json index = shard_index_json(v.plan, shards);
  EXPECT_EQ(index["metadata"]["total_size"], v.plan.output_bytes);
  EXPECT_EQ(index["weight_map"].size(), v.outputs.size());
  for (const Shard& shard : shards)
    for (size_t i : shard.items)
      for (const OutputTensor& o : v.plan.items[i].outputs) EXPECT_EQ(index["weight_map"][o.name], shard.file_name);

  const std::vector<Shard> one = assign_shards(v.plan, parse_size("5GB"));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].file_name, "model.safetensors");
}

TEST(ConvertConfig, QuantizationConfigsListWhatWasWritten) {
  const PlanView int4 = plan(reference_bf16_tensors(small_config()), WeightsMode::HybridInt4Fp8);
  const nlohmann::ordered_json q = int4_quantization_config(int4.plan, 32);
  EXPECT_EQ(q["quant_method"], "auto-round");
  EXPECT_EQ(q["packing_format"], "auto_round:auto_gptq");
  EXPECT_EQ(q["bits"], 4);
  EXPECT_EQ(q["group_size"], 32);
  EXPECT_EQ(q["sym"], true);
  EXPECT_EQ(q["block_name_to_quantize"], "model.layers,mtp.layers");
  // extra_config: exactly the BF16 Linear modules (not lm_head, which AutoRound never quantises).
  std::set<std::string> keys;
  for (const auto& [k, v] : q["extra_config"].items()) {
    keys.insert(k);
    EXPECT_EQ(v, (nlohmann::ordered_json{{"bits", 16}, {"data_type", "fp"}})) << k;
  }
  EXPECT_EQ(keys.size(), 5u * 2 + 3 * 2 + 1);
  EXPECT_TRUE(keys.count("model.layers.0.mlp.shared_expert_gate"));
  EXPECT_TRUE(keys.count("mtp.fc"));
  EXPECT_FALSE(keys.count("lm_head"));
  EXPECT_FALSE(keys.count("model.layers.3.self_attn.q_proj"));  // FP8: not declared BF16

  const PlanView fp8 = plan(reference_bf16_tensors(small_config()), WeightsMode::Fp8Block);
  const nlohmann::ordered_json f = fp8_quantization_config(fp8.plan);
  EXPECT_EQ(f["quant_method"], "fp8");
  EXPECT_EQ(f["fmt"], "e4m3");
  EXPECT_EQ(f["activation_scheme"], "dynamic");
  EXPECT_EQ(f["weight_block_size"], (nlohmann::ordered_json{128, 128}));
  EXPECT_EQ(f["modules_to_not_convert"].size(), 5u * 2 + 3 * 2 + 1 + 1);

  // Parsed back by io, and the MTP layer count goes into text_config of a composite config.
  const io::QuantizationConfig parsed = io::parse_quantization_config(nlohmann::json::parse(q.dump()), "test");
  EXPECT_EQ(parsed.group_size, 32);
  nlohmann::ordered_json composite = {{"model_type", "qwen3_5_moe"}, {"text_config", {{"hidden_size", 64}}}};
  EXPECT_TRUE(set_mtp_layers_if_missing(composite, 1));
  EXPECT_EQ(composite["text_config"]["mtp_num_hidden_layers"], 1);
  EXPECT_FALSE(set_mtp_layers_if_missing(composite, 2));
  EXPECT_EQ(mtp_num_hidden_layers(composite), 1);
}

}  // namespace
}  // namespace moeserve::tools
