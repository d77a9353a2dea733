// The CPU model over quantised checkpoints the fixtures have not seen: the tests' own packers
// (tests/unit/quant/test_packing.h, another seed, other group sizes) quantise the
// quant_base_bf16 fixture into one checkpoint holding every format at once (AutoRound INT4
// with extra_config overrides, asymmetric act-order INT4 experts, FP8 block attention, both
// NVFP4 flavours), and a dense twin holds the weights those packers dequantised. The two
// must give the same logits and the same greedy tokens. Also: --int8-lm-head on the CPU.
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../quant/quant_test_util.h"
#include "../quant/test_packing.h"
#include "io/checkpoint.h"
#include "model/qwen35_cpu.h"
#include "model/sequence_runner.h"

namespace moeserve::model {
namespace {
namespace qt = quant::testing;
using nlohmann::json;
using TensorList = std::vector<std::pair<std::string, Tensor>>;

const std::string kBase = "quant_base_bf16";

std::string disk_name(const std::string& canonical) {
  return canonical.rfind("lm_head.", 0) == 0 ? canonical : "model." + canonical;
}

json base_config() {
  std::ifstream f(qt::fixture_dir(kBase) / "config.json");
  return json::parse(f);
}

void write_checkpoint(const std::filesystem::path& dir, const TensorList& tensors, const json& config) {
  qt::write_model(dir, tensors);
  std::ofstream(dir / "config.json") << config.dump(2);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class Plan { Dense, Int4Sym, Int4AsymActOrder, Fp8, Nvfp4Ct, Nvfp4ModelOpt };

// Which format each Linear of the base model gets.
Plan plan_for(const std::string& module) {
  if (module.find(".mlp.experts.") != std::string::npos) return Plan::Int4AsymActOrder;
  if (module.find(".self_attn.") != std::string::npos) return Plan::Fp8;
  if (ends_with(module, "in_proj_qkv") || ends_with(module, "in_proj_z") || ends_with(module, "out_proj"))
    return Plan::Int4Sym;
  if (ends_with(module, "shared_expert.gate_proj") || ends_with(module, "shared_expert.up_proj")) return Plan::Nvfp4Ct;
  if (ends_with(module, "shared_expert.down_proj")) return Plan::Nvfp4ModelOpt;
  return Plan::Dense;  // router, shared_expert_gate, in_proj_a/b, lm_head
}

// AutoRound config: group 64 symmetric by default, experts overridden by regex to group 32
// asymmetric, shared_expert_gate declared 16-bit.
const json kQuantConfig = {
    {"quant_method", "auto-round"},
    {"packing_format", "auto_round:auto_gptq"},
    {"bits", 4},
    {"group_size", 64},
    {"sym", true},
    {"data_type", "int"},
    {"extra_config",
     {{".*mlp\\.experts\\.[0-9]+\\..*", {{"group_size", 32}, {"sym", false}}},
      {"model.layers.0.mlp.shared_expert_gate", {{"bits", 16}, {"data_type", "fp"}}}}}};

struct Checkpoints {
  qt::TempDir quantised{"model_quantised"};
  qt::TempDir dense{"model_dense_twin"};
  std::map<Plan, int> counts;
};

// Writes the quantised checkpoint and its dense twin from the base fixture.
void make_checkpoints(Checkpoints& out) {
  const io::Checkpoint base = io::Checkpoint::open(qt::fixture_dir(kBase));
  std::mt19937 rng(31337);
  TensorList quantised, dense;
  for (const std::string& name : base.names()) {
    const Tensor t = base.get(name);
    const std::string module = name.substr(0, name.size() - 7);
    const bool linear = ends_with(name, ".weight") && t.ndim() == 2 && name != "embed_tokens.weight";
    const Plan plan = linear ? plan_for(module) : Plan::Dense;
    ++out.counts[plan];
    if (plan == Plan::Dense) {
      quantised.emplace_back(disk_name(name), t);
      dense.emplace_back(disk_name(name), t);
      continue;
    }
    const int64_t N = t.dim(0), K = t.dim(1);
    const std::vector<float> W = t.to_f32();
    qt::Packed p;
    switch (plan) {
      case Plan::Int4Sym: p = qt::pack_gptq_int4(W, N, K, 64, true, false, rng); break;
      case Plan::Int4AsymActOrder: p = qt::pack_gptq_int4(W, N, K, 32, false, true, rng); break;
      case Plan::Fp8: p = qt::pack_fp8_block(W, N, K, 128, 128, DType::F32); break;
      case Plan::Nvfp4Ct: p = qt::pack_nvfp4(W, N, K, false); break;
      case Plan::Nvfp4ModelOpt: p = qt::pack_nvfp4(W, N, K, true); break;
      case Plan::Dense: break;
    }
    for (const auto& [suffix, packed] : p.tensors) quantised.emplace_back(disk_name(module + "." + suffix), packed);
    dense.emplace_back(disk_name(name), Tensor::from_f32(p.dequantized, {N, K}));
  }
  json config = base_config();
  write_checkpoint(out.dense.path(), dense, config);
  config["quantization_config"] = kQuantConfig;
  write_checkpoint(out.quantised.path(), quantised, config);
}

std::vector<int32_t> reference_ids(const std::string& tensor) {
  const auto ref = io::SafetensorsFile::open(qt::fixture_dir(kBase) / "reference.safetensors");
  const Tensor x = ref->tensor(tensor);
  std::vector<int32_t> ids(size_t(x.numel()));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(x.data<int64_t>()[i]);
  return ids;
}

std::vector<float> teacher_forced_logits(const std::filesystem::path& dir, const CpuModelOptions& options) {
  auto model = Qwen35CpuModel::load(dir, options);
  const std::vector<int32_t> ids = reference_ids("input_ids");
  SequenceRunner runner(*model, int64_t(ids.size()));
  return runner.append(ids, 16, true);
}

std::vector<int32_t> greedy(const std::filesystem::path& dir, int n) {
  auto model = Qwen35CpuModel::load(dir, CpuModelOptions{2, 16, false});
  const std::vector<int32_t> prompt = reference_ids("greedy_prompt_ids");
  SequenceRunner runner(*model, int64_t(prompt.size()) + n);
  std::vector<float> logits = runner.append(prompt, 512, false);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    logits = runner.append(std::span(&next, 1), 1, false);
  }
  return out;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return a.size() != b.size() ? INFINITY : num / den;
}

TEST(QuantisedModel, EveryFormatInOneCheckpointScoresLikeItsDequantisedTwin) {
  Checkpoints c;
  make_checkpoints(c);
  // Every format is present: 5 layers x 8 experts x 3, 1 full-attention layer x 4, 4 GDN
  // layers x 3, 5 x 2 NVFP4 compressed-tensors, 5 NVFP4 ModelOpt.
  EXPECT_EQ(c.counts[Plan::Int4AsymActOrder], 5 * 8 * 3);
  EXPECT_EQ(c.counts[Plan::Fp8], 4);
  EXPECT_EQ(c.counts[Plan::Int4Sym], 4 * 3);
  EXPECT_EQ(c.counts[Plan::Nvfp4Ct], 5 * 2);
  EXPECT_EQ(c.counts[Plan::Nvfp4ModelOpt], 5);

  const CpuModelOptions options{2, 16, false};
  const std::vector<float> quantised = teacher_forced_logits(c.quantised.path(), options);
  const std::vector<float> twin = teacher_forced_logits(c.dense.path(), options);
  const std::vector<float> base = teacher_forced_logits(qt::fixture_dir(kBase), options);
  const double d_twin = rel_diff(quantised, twin), d_base = rel_diff(quantised, base);
  std::printf("  quantised vs dequantised twin: rel diff %.3g; vs the unquantised base: %.3g\n", d_twin, d_base);
  // The same fp32 weights through the same kernels: identical logits.
  ASSERT_EQ(quantised.size(), twin.size());
  EXPECT_EQ(0, std::memcmp(quantised.data(), twin.data(), quantised.size() * sizeof(float)));
  // ... and quantisation really happened (4-bit weights move the logits).
  EXPECT_GT(d_base, 1e-3);
  EXPECT_EQ(greedy(c.quantised.path(), 12), greedy(c.dense.path(), 12));
}

TEST(QuantisedModel, Int8LmHeadOnTheCpuIsTheRowwiseQuantisedHead) {
  // The dense twin holds the LM head quantised here: scale = max|w| / 127 per row, codes
  // rounded half away from zero, W' = code * scale.
  const io::Checkpoint base = io::Checkpoint::open(qt::fixture_dir(kBase));
  qt::TempDir twin("model_int8_head_twin");
  TensorList tensors;
  for (const std::string& name : base.names()) {
    if (name != "lm_head.weight") {
      tensors.emplace_back(disk_name(name), base.get(name));
      continue;
    }
    const Tensor head = base.get(name);
    const int64_t V = head.dim(0), H = head.dim(1);
    std::vector<float> w = head.to_f32();
    for (int64_t v = 0; v < V; ++v) {
      float* row = w.data() + v * H;
      float amax = 0;
      for (int64_t h = 0; h < H; ++h) amax = std::max(amax, std::fabs(row[h]));
      const float s = amax / 127.0f;
      for (int64_t h = 0; h < H; ++h) row[h] = std::round(row[h] / s) * s;
    }
    tensors.emplace_back(disk_name(name), Tensor::from_f32(w, {V, H}));
  }
  write_checkpoint(twin.path(), tensors, base_config());

  const std::vector<float> int8 = teacher_forced_logits(qt::fixture_dir(kBase), CpuModelOptions{2, 16, false, true});
  const std::vector<float> expected = teacher_forced_logits(twin.path(), CpuModelOptions{2, 16, false});
  const std::vector<float> bf16 = teacher_forced_logits(qt::fixture_dir(kBase), CpuModelOptions{2, 16, false});
  ASSERT_EQ(int8.size(), expected.size());
  EXPECT_EQ(0, std::memcmp(int8.data(), expected.data(), int8.size() * sizeof(float)));
  const double d = rel_diff(int8, bf16);
  std::printf("  INT8 LM head vs BF16 head: logits rel diff %.3g\n", d);
  EXPECT_GT(d, 0.0);
  EXPECT_LT(d, 2e-2);
}

}  // namespace
}  // namespace moeserve::model
