// `moeserve inspect` on a small checkpoint written here with SafetensorsWriter: one weight of
// every storage format, fused and per-expert experts, MTP and a vision tensor. The expected
// byte counts below are worked out by hand from the shapes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "tools/inspect.h"

namespace moeserve::tools {
namespace {

namespace fs = std::filesystem;

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moeserve_inspect_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << R"({
      "model_type": "qwen3_5_moe_text", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
      "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 4, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
      "linear_key_head_dim": 4, "linear_value_head_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 4, "shared_expert_intermediate_size": 4, "max_position_embeddings": 64,
      "mtp_num_hidden_layers": 1, "rope_parameters": {"rope_theta": 10000, "partial_rotary_factor": 0.5},
      "quantization_config": {"quant_method": "auto-round", "bits": 4, "group_size": 128}})";

    using D = DType;
    std::vector<io::SafetensorsWriter::Declaration> decl = {
        {"model.embed_tokens.weight", {D::BF16, {10, 8}}},                       // 160
        {"lm_head.weight", {D::BF16, {10, 8}}},                                  // 160
        {"model.norm.weight", {D::F32, {8}}},                                    // 32
        {"model.layers.0.input_layernorm.weight", {D::BF16, {8}}},               // 16
        {"model.layers.0.post_attention_layernorm.weight", {D::BF16, {8}}},      // 16
        // NVFP4, compressed-tensors: 64 + 16 + 4 = 84
        {"model.layers.0.linear_attn.in_proj_qkv.weight_packed", {D::U8, {16, 4}}},
        {"model.layers.0.linear_attn.in_proj_qkv.weight_scale", {D::F8_E4M3, {16, 1}}},
        {"model.layers.0.linear_attn.in_proj_qkv.weight_global_scale", {D::F32, {1}}},
        // NVFP4, ModelOpt: 32 + 8 + 4 + 4 = 48
        {"model.layers.0.linear_attn.out_proj.weight", {D::U8, {8, 4}}},
        {"model.layers.0.linear_attn.out_proj.weight_scale", {D::F8_E4M3, {8, 1}}},
        {"model.layers.0.linear_attn.out_proj.weight_scale_2", {D::F32, {}}},
        {"model.layers.0.linear_attn.out_proj.input_scale", {D::F32, {}}},
        {"model.layers.0.linear_attn.A_log", {D::F32, {2}}},                     // 8
        {"model.layers.0.linear_attn.dt_bias", {D::BF16, {2}}},                  // 4
        {"model.layers.0.linear_attn.conv1d.weight", {D::BF16, {16, 1, 4}}},     // 128
        {"model.layers.0.linear_attn.norm.weight", {D::F32, {4}}},               // 16
        {"model.layers.0.mlp.gate.weight", {D::BF16, {4, 8}}},                   // 64
        {"model.layers.0.mlp.shared_expert.gate_proj.weight", {D::F8_E4M3, {4, 8}}},       // 32
        {"model.layers.0.mlp.shared_expert.gate_proj.weight_scale_inv", {D::BF16, {1, 1}}},  // 2
        {"model.layers.0.mlp.shared_expert_gate.weight", {D::BF16, {1, 8}}},     // 16
        {"model.layers.1.input_layernorm.weight", {D::BF16, {8}}},               // 16
        {"model.layers.1.post_attention_layernorm.weight", {D::BF16, {8}}},      // 16
        {"model.layers.1.self_attn.q_proj.weight", {D::BF16, {16, 8}}},          // 256
        {"model.layers.1.self_attn.k_norm.weight", {D::F32, {4}}},               // 16
        {"model.layers.1.mlp.gate.weight", {D::BF16, {4, 8}}},                   // 64
        {"model.layers.1.mlp.experts.gate_up_proj", {D::BF16, {4, 8, 8}}},       // 512
        {"model.layers.1.mlp.experts.down_proj", {D::BF16, {4, 8, 4}}},          // 256
        {"mtp.fc.weight", {D::BF16, {8, 16}}},                                   // 256
        {"mtp.layers.0.mlp.experts.gate_up_proj", {D::BF16, {4, 8, 8}}},         // 512
        {"mtp.norm.weight", {D::BF16, {8}}},                                     // 16
        {"model.visual.patch_embed.weight", {D::F32, {2}}},                      // skipped
    };
    // GPTQ INT4 per expert: qweight 16 + qzeros 4 + scales 8 = 28, x 4 experts = 112.
    for (int e = 0; e < 4; ++e) {
      const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".gate_proj.";
      decl.push_back({p + "qweight", {D::I32, {1, 4}}});
      decl.push_back({p + "qzeros", {D::I32, {1, 1}}});
      decl.push_back({p + "scales", {D::F16, {1, 4}}});
    }
    std::vector<std::pair<std::string, size_t>> sizes;
    for (const auto& [name, ts] : decl) sizes.push_back({name, size_t(shape_numel(ts.second)) * dtype_size(ts.first)});
    io::SafetensorsWriter writer(dir_ / "model.safetensors", decl, {{"format", "pt"}});
    for (const auto& [name, bytes] : sizes) {
      std::vector<char> zeros(bytes);
      writer.write_tensor(name, zeros.data(), bytes);
    }
    writer.finish();
  }
  void TearDown() override { fs::remove_all(dir_); }

  const KindSummary* find(const InspectReport& r, WeightKind kind, const std::string& format) {
    for (const KindSummary& s : r.summary)
      if (s.kind == kind && s.format == format) return &s;
    return nullptr;
  }

  fs::path dir_;
};

TEST_F(InspectTest, GroupsWeightsByKindAndFormat) {
  const InspectReport r = inspect_checkpoint(dir_);
  ASSERT_TRUE(r.config) << r.config_error;
  EXPECT_EQ(r.files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(r.file_bytes, fs::file_size(dir_ / "model.safetensors"));
  EXPECT_EQ(r.tensor_bytes, 2818u);  // everything but the vision tensor

  struct Row { WeightKind kind; const char* format; int64_t weights, tensors; uint64_t bytes; };
  const std::vector<Row> expected = {
      {WeightKind::Embedding, "bf16", 1, 1, 160},
      {WeightKind::Attention, "bf16", 1, 1, 256},
      {WeightKind::DeltaNet, "nvfp4", 1, 3, 84},
      {WeightKind::DeltaNet, "nvfp4-modelopt", 1, 4, 48},
      {WeightKind::DeltaNet, "f32", 1, 1, 8},
      {WeightKind::DeltaNet, "bf16", 2, 2, 132},
      {WeightKind::Router, "bf16", 2, 2, 128},
      {WeightKind::RoutedExperts, "gptq-int4", 4, 12, 112},
      {WeightKind::RoutedExperts, "bf16", 2, 2, 768},
      {WeightKind::SharedExpert, "fp8-block", 1, 2, 34},
      {WeightKind::SharedExpert, "bf16", 1, 1, 16},
      {WeightKind::Norm, "bf16", 4, 4, 64},
      {WeightKind::Norm, "f32", 3, 3, 64},
      {WeightKind::LmHead, "bf16", 1, 1, 160},
      {WeightKind::Mtp, "bf16", 3, 3, 784},
  };
  EXPECT_EQ(r.summary.size(), expected.size());
  for (const Row& row : expected) {
    const KindSummary* s = find(r, row.kind, row.format);
    ASSERT_NE(s, nullptr) << weight_kind_name(row.kind) << " " << row.format;
    EXPECT_EQ(s->weights, row.weights) << weight_kind_name(row.kind) << " " << row.format;
    EXPECT_EQ(s->tensors, row.tensors) << weight_kind_name(row.kind) << " " << row.format;
    EXPECT_EQ(s->bytes, row.bytes) << weight_kind_name(row.kind) << " " << row.format;
  }
}

TEST_F(InspectTest, BytesPerDecodedToken) {
  const InspectReport r = inspect_checkpoint(dir_);
  ASSERT_TRUE(r.decode);
  EXPECT_EQ(r.decode->routed_experts, 440u);  // (112 + 768) * 2 / 4
  EXPECT_EQ(r.decode->embedding, 16u);        // one row of 10
  EXPECT_EQ(r.decode->other, 994u);           // 2818 - 160 - 880 - 784
  EXPECT_EQ(r.decode->total, 1450u);
  EXPECT_EQ(r.decode->mtp_per_draft, 704u);   // 256 + 16 + 512 * 2 / 4 + lm_head 160 + row 16
}

TEST_F(InspectTest, TextAndJson) {
  const InspectReport r = inspect_checkpoint(dir_);
  const std::string text = format_inspect_text(r, true);
  for (const char* part : {"qwen3_5_moe_text", "2: 1 Gated DeltaNet (L) + 1 gated full attention (F); pattern LF",
                           "full attn   layers 1", "4 experts, top 2", "quantized   auto-round, 4 bits, group 128",
                           "routed experts  ", "(x 2/4 experts)", "gptq-int4", "fp8-block", "nvfp4-modelopt",
                           "layers.0.mlp.experts.3.gate_proj", "1450"})
    EXPECT_NE(text.find(part), std::string::npos) << "missing '" << part << "' in\n" << text;
  EXPECT_EQ(text.find("visual"), std::string::npos);

  const nlohmann::json j = inspect_to_json(r, true);
  EXPECT_EQ(j["tensor_bytes"], 2818);
  EXPECT_EQ(j["bytes_per_token"]["total"], 1450);
  EXPECT_EQ(j["config"]["layer_types"], (nlohmann::json{"linear_attention", "full_attention"}));
  EXPECT_EQ(j["config"]["quant_method"], "auto-round");
  EXPECT_EQ(j["kinds"].size(), 15u);
  bool found = false;
  for (const auto& w : j["weights"])
    if (w["name"] == "layers.0.linear_attn.in_proj_qkv") {
      found = true;
      EXPECT_EQ(w["format"], "nvfp4");
      EXPECT_EQ(w["kind"], "deltanet");
      EXPECT_EQ(w["shape"], (nlohmann::json{16, 4}));
      EXPECT_EQ(w["bytes"], 84);
      EXPECT_EQ(w["tensors"].size(), 3u);
    }
  EXPECT_TRUE(found);
  EXPECT_FALSE(inspect_to_json(r, false).contains("weights"));
}

TEST_F(InspectTest, WorksWithoutAConfig) {
  fs::remove(dir_ / "config.json");
  const InspectReport r = inspect_checkpoint(dir_);
  EXPECT_FALSE(r.config);
  EXPECT_NE(r.config_error.find("config.json"), std::string::npos);
  EXPECT_FALSE(r.decode);
  EXPECT_EQ(r.tensor_bytes, 2818u);
  EXPECT_NE(format_inspect_text(r, false).find("config        unavailable"), std::string::npos);
}

TEST(InspectClassify, KindsFromCanonicalNames) {
  EXPECT_EQ(classify_weight("embed_tokens"), WeightKind::Embedding);
  EXPECT_EQ(classify_weight("lm_head"), WeightKind::LmHead);
  EXPECT_EQ(classify_weight("norm"), WeightKind::Norm);
  EXPECT_EQ(classify_weight("layers.3.self_attn.q_norm"), WeightKind::Norm);
  EXPECT_EQ(classify_weight("layers.0.linear_attn.norm"), WeightKind::Norm);
  EXPECT_EQ(classify_weight("layers.3.self_attn.o_proj"), WeightKind::Attention);
  EXPECT_EQ(classify_weight("layers.0.linear_attn.in_proj_b"), WeightKind::DeltaNet);
  EXPECT_EQ(classify_weight("layers.0.mlp.gate"), WeightKind::Router);
  EXPECT_EQ(classify_weight("layers.0.mlp.experts.gate_up_proj"), WeightKind::RoutedExperts);
  EXPECT_EQ(classify_weight("layers.0.mlp.experts.17.down_proj"), WeightKind::RoutedExperts);
  EXPECT_EQ(classify_weight("layers.0.mlp.shared_expert.up_proj"), WeightKind::SharedExpert);
  EXPECT_EQ(classify_weight("layers.0.mlp.shared_expert_gate"), WeightKind::SharedExpert);
  EXPECT_EQ(classify_weight("mtp.layers.0.mlp.gate"), WeightKind::Mtp);
}

}  // namespace
}  // namespace moeserve::tools
