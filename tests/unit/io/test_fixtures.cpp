// Opens the checkpoints that transformers 5.17 + the Python safetensors library wrote
// (tests/fixtures/qwen35, made by tests/fixtures/make_qwen35_fixtures.py): plain, composite
// with "model.language_model." names and 3 shards, "language_model.model." names, and the
// quantised formats. The config parser must accept each config.json, and the tensors that no
// format quantises must have exactly the shapes the config implies (spec 3.1).
#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io/qwen35_config.h"
#include "io_test_util.h"

namespace moeserve::io {
namespace {

const std::filesystem::path kRoot = std::filesystem::path(MOESERVE_FIXTURES_DIR) / "qwen35";

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kRoot, ec))
    if (entry.is_directory() && std::filesystem::exists(entry.path() / "config.json"))
      names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void expect_shape(const Checkpoint& ckpt, const std::string& name, const Shape& shape) {
  ASSERT_TRUE(ckpt.has(name)) << name;
  EXPECT_EQ(ckpt.info(name).shape, shape) << name << " from " << ckpt.source_of(name);
}

TEST(Fixtures, EveryFixtureOpensWithConsistentShapes) {
  const std::vector<std::string> names = fixture_names();
  ASSERT_GE(names.size(), 3u) << "no fixtures under " << kRoot;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::filesystem::path dir = kRoot / name;
    const Qwen35Config c = load_qwen35_config(dir);
    const Checkpoint ckpt = Checkpoint::open(dir);
    const int64_t H = c.hidden_size;
    expect_shape(ckpt, "embed_tokens.weight", {c.vocab_size, H});
    expect_shape(ckpt, "norm.weight", {H});
    if (!c.tie_word_embeddings) EXPECT_TRUE(ckpt.has("lm_head.weight") || ckpt.has("lm_head.qweight"));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      expect_shape(ckpt, p + "input_layernorm.weight", {H});
      expect_shape(ckpt, p + "post_attention_layernorm.weight", {H});
      expect_shape(ckpt, p + "mlp.gate.weight", {c.num_experts, H});
      if (c.layer_types[size_t(l)] == LayerType::LinearAttention) {
        expect_shape(ckpt, p + "linear_attn.A_log", {c.linear_num_value_heads});
        expect_shape(ckpt, p + "linear_attn.dt_bias", {c.linear_num_value_heads});
        expect_shape(ckpt, p + "linear_attn.conv1d.weight", {c.linear_conv_dim(), 1, c.linear_conv_kernel_dim});
        expect_shape(ckpt, p + "linear_attn.norm.weight", {c.linear_value_head_dim});
        EXPECT_FALSE(ckpt.has(p + "self_attn.k_norm.weight"));
      } else {
        expect_shape(ckpt, p + "self_attn.q_norm.weight", {c.head_dim});
        expect_shape(ckpt, p + "self_attn.k_norm.weight", {c.head_dim});
        EXPECT_FALSE(ckpt.has(p + "linear_attn.A_log"));
      }
    }
    // Nothing keeps a source prefix; the vision tower never appears.
    for (const std::string& n : ckpt.names()) {
      EXPECT_NE(n.rfind("model.", 0), 0u) << n;
      EXPECT_NE(n.rfind("language_model.", 0), 0u) << n;
      EXPECT_EQ(n.find("visual"), std::string::npos) << n;
    }
    if (ckpt.has("mtp.norm.weight")) expect_shape(ckpt, "mtp.norm.weight", {H});
    // The reference outputs file was written by the same library.
    if (std::filesystem::exists(dir / "reference.safetensors"))
      EXPECT_FALSE(SafetensorsFile::open(dir / "reference.safetensors")->tensors().empty());
  }
}

TEST(Fixtures, CompositeShardedNamesAndConfig) {
  const std::filesystem::path dir = kRoot / "composite_bf16_fused_sharded";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " absent";
  const Qwen35Config c = load_qwen35_config(dir);
  EXPECT_EQ(c.outer_model_type, "qwen3_5_moe");
  EXPECT_EQ(c.hidden_size, 72);
  EXPECT_EQ(c.rotary_dim(), 6);
  EXPECT_EQ(c.layer_types[1], LayerType::FullAttention);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{7});
  const Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_EQ(ckpt.files().size(), 3u);
  // Fused experts [E, 2I, H] / [E, H, I] (spec 3.1).
  expect_shape(ckpt, "layers.0.mlp.experts.gate_up_proj", {c.num_experts, 2 * c.moe_intermediate_size, c.hidden_size});
  expect_shape(ckpt, "layers.0.mlp.experts.down_proj", {c.num_experts, c.hidden_size, c.moe_intermediate_size});
  EXPECT_EQ(ckpt.source_of("norm.weight").find(": model.language_model.norm.weight") != std::string::npos, true);
  EXPECT_EQ(ckpt.get("layers.0.linear_attn.A_log").dtype(), DType::F32);  // kept F32 (spec 2.9)
  EXPECT_EQ(ckpt.get("layers.0.input_layernorm.weight").dtype(), DType::BF16);
}

TEST(Fixtures, LanguageModelPrefixMapsTheHeadToo) {
  const std::filesystem::path dir = kRoot / "lmprefix_gqa4_bf16";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " absent";
  const Checkpoint ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.has("lm_head.weight"));
  EXPECT_NE(ckpt.source_of("lm_head.weight").find(": language_model.lm_head.weight"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::io
