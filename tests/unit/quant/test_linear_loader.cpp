// LinearLoader on small synthetic checkpoints written with io's SafetensorsWriter: the format
// of every module comes from its tensors (all formats side by side in one file), the
// quantization_config supplies INT4 group sizes and exclusions, and every corrupt or
// inconsistent module fails with an error naming the checkpoint, the tensor and its file.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "quant/linear_loader.h"
#include "quant_test_util.h"
#include "test_packing.h"

namespace moeserve::quant {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;
using nlohmann::json;
using TensorList = std::vector<std::pair<std::string, Tensor>>;

const json kAutoRound32 = {{"quant_method", "auto-round"}, {"packing_format", "auto_round:auto_gptq"},
                           {"bits", 4},                    {"group_size", 32},
                           {"sym", true},                  {"data_type", "int"}};

// Adds a packed module under "model.<module>.<suffix>".
void add(TensorList& out, const std::string& module, const testing::Packed& p) {
  for (const auto& [suffix, t] : p.tensors) out.emplace_back("model." + module + "." + suffix, t);
}

// A checkpoint directory with the given tensors and a loader over it.
class Fixture {
 public:
  Fixture(const TensorList& tensors, const json& quantization_config) : dir_("loader") {
    testing::write_model(dir_.path(), tensors);
    ckpt_ = std::make_unique<io::Checkpoint>(io::Checkpoint::open(dir_.path()));
    config_ = testing::config_with(quantization_config);
  }
  QuantWeight load(const std::string& module, int64_t n, int64_t k) const {
    return LinearLoader(*ckpt_, config_).load(module, n, k);
  }
  std::string error(const std::string& module, int64_t n, int64_t k) const {
    try {
      load(module, n, k);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::string dir() const { return dir_.path().string(); }

 private:
  testing::TempDir dir_;
  std::unique_ptr<io::Checkpoint> ckpt_;
  io::Qwen35Config config_;
};

struct Modules {
  std::mt19937 rng{2024};
  const int64_t N = 48, K = 64;
  std::vector<float> W = testing::random_weight(N, K, rng);
  testing::Packed int4 = testing::pack_gptq_int4(W, N, K, 32, true, false, rng);
  testing::Packed int4_asym = testing::pack_gptq_int4(W, N, K, 32, false, true, rng);
  testing::Packed fp8 = testing::pack_fp8_block(W, N, K, 128, 128, DType::BF16);
  testing::Packed ct = testing::pack_nvfp4(W, N, K, false);
  testing::Packed mo = testing::pack_nvfp4(W, N, K, true);
};

size_t bytes_of(const testing::Packed& p, std::initializer_list<const char*> suffixes) {
  size_t n = 0;
  for (const char* s : suffixes) n += p.tensors.at(s).nbytes();
  return n;
}

TEST(LinearLoader, EachModuleFormatComesFromItsTensors) {
  Modules m;
  TensorList t;
  add(t, "layers.0.mlp.experts.0.gate_proj", m.int4);
  add(t, "layers.0.self_attn.q_proj", m.fp8);
  add(t, "layers.0.mlp.shared_expert.up_proj", m.ct);
  add(t, "layers.0.mlp.shared_expert.down_proj", m.mo);
  t.emplace_back("model.layers.0.mlp.gate.weight", testing::bf16_tensor({m.N, m.K}, m.W));
  const Fixture f(t, kAutoRound32);

  const QuantWeight int4 = f.load("layers.0.mlp.experts.0.gate_proj", m.N, m.K);
  EXPECT_EQ(int4.format, WeightFormat::GptqInt4);
  EXPECT_EQ(int4.group_size, 32);
  EXPECT_EQ(testing::dequantize_all(int4), m.int4.dequantized);
  EXPECT_EQ(int4.stored_bytes(), bytes_of(m.int4, {"qweight", "qzeros", "scales"}));

  const QuantWeight fp8 = f.load("layers.0.self_attn.q_proj", m.N, m.K);
  EXPECT_EQ(fp8.format, WeightFormat::Fp8Block);
  EXPECT_EQ(testing::dequantize_all(fp8), m.fp8.dequantized);
  EXPECT_EQ(fp8.stored_bytes(), size_t(m.N * m.K + 2));

  // NVFP4 input scales are tolerated and not part of the weight.
  const QuantWeight ct = f.load("layers.0.mlp.shared_expert.up_proj", m.N, m.K);
  EXPECT_EQ(ct.format, WeightFormat::Nvfp4);
  EXPECT_EQ(testing::dequantize_all(ct), m.ct.dequantized);
  EXPECT_EQ(ct.stored_bytes(), bytes_of(m.ct, {"weight_packed", "weight_scale", "weight_global_scale"}));
  const QuantWeight mo = f.load("layers.0.mlp.shared_expert.down_proj", m.N, m.K);
  EXPECT_EQ(mo.format, WeightFormat::Nvfp4);
  EXPECT_EQ(testing::dequantize_all(mo), m.mo.dequantized);
  EXPECT_EQ(mo.stored_bytes(), bytes_of(m.mo, {"weight", "weight_scale", "weight_scale_2"}));

  const QuantWeight dense = f.load("layers.0.mlp.gate", m.N, m.K);
  EXPECT_EQ(dense.format, WeightFormat::Dense);
  EXPECT_EQ(dense.stored_bytes(), size_t(m.N * m.K * 2));
}

TEST(LinearLoader, WithoutAnInt4ConfigGroupSizeAndSymmetryComeFromTheTensors) {
  Modules m;
  TensorList t;
  add(t, "layers.0.mlp.experts.0.up_proj", m.int4);
  add(t, "layers.0.mlp.experts.1.up_proj", m.int4_asym);
  for (const json& config : {json(), json{{"quant_method", "fp8"}}}) {
    const Fixture f(t, config);
    const QuantWeight sym = f.load("layers.0.mlp.experts.0.up_proj", m.N, m.K);
    EXPECT_EQ(sym.group_size, 32);
    EXPECT_TRUE(sym.sym);
    EXPECT_EQ(testing::dequantize_all(sym), m.int4.dequantized);
    const QuantWeight asym = f.load("layers.0.mlp.experts.1.up_proj", m.N, m.K);
    EXPECT_FALSE(asym.sym);
    EXPECT_TRUE(asym.has_part("g_idx"));
    EXPECT_EQ(testing::dequantize_all(asym), m.int4_asym.dequantized);
  }
}

TEST(LinearLoader, ExtraConfigGroupSizeOverride) {
  Modules m;
  TensorList t;
  add(t, "layers.0.mlp.experts.0.up_proj", m.int4);
  json config = kAutoRound32;
  config["group_size"] = 128;  // does not divide K = 64 ...
  EXPECT_THAT(Fixture(t, config).error("layers.0.mlp.experts.0.up_proj", m.N, m.K),
              AllOf(HasSubstr("group size 128 does not divide in_features 64"), HasSubstr("layers.0.mlp.experts.0.up_proj")));
  config["extra_config"] = {{"model.layers.0.mlp.experts.0.up_proj", {{"group_size", 32}}}};  // ... unless overridden
  EXPECT_EQ(testing::dequantize_all(Fixture(t, config).load("layers.0.mlp.experts.0.up_proj", m.N, m.K)),
            m.int4.dequantized);
  config["extra_config"] = {{".*experts\\.0\\..*", {{"group_size", 32}}}};
  EXPECT_EQ(Fixture(t, config).load("layers.0.mlp.experts.0.up_proj", m.N, m.K).group_size, 32);
}

// Each corruption: the tensors, the module and the phrases its error must contain.
struct Corruption {
  std::string what;
  std::function<void(TensorList&, const Modules&)> build;
  json config;
  std::vector<std::string> phrases;
  int64_t k = 64;
};

TEST(LinearLoaderErrors, EveryCorruptionNamesTheCheckpointTensorAndFile) {
  const std::string M = "layers.0.mlp.experts.0.up_proj";
  // The packed module minus the `drop` suffixes, with `replace` tensors swapped in.
  const auto with = [&](const testing::Packed& p, std::vector<std::string> drop, TensorList replace = {}) {
    return [=](TensorList& t, const Modules&) {
      for (const auto& [suffix, tensor] : p.tensors) {
        if (std::find(drop.begin(), drop.end(), suffix) != drop.end()) continue;
        auto r = std::find_if(replace.begin(), replace.end(), [&](const auto& x) { return x.first == suffix; });
        t.emplace_back("model." + M + "." + suffix, r != replace.end() ? r->second : tensor);
      }
    };
  };
  const auto patched = [](json base, const json& patch) {
    base.merge_patch(patch);
    return base;
  };
  Modules m;
  const json asym = patched(kAutoRound32, {{"sym", false}});
  std::vector<int32_t> bad_g_idx(64, 0);
  bad_g_idx[10] = 7;
  const std::vector<Corruption> cases = {
      {"qweight shape", with(m.int4, {}, {{"qweight", Tensor::empty(DType::I32, {4, 48})}}), kAutoRound32,
       {"tensor " + M + ".qweight", "model.safetensors: model." + M + ".qweight", "[4, 48]", "expected [8, 48]"}},
      {"missing scales", with(m.int4, {"scales"}), kAutoRound32, {"module " + M, "no scales"}},
      {"missing qzeros (asym)", with(m.int4_asym, {"qzeros"}), asym, {"module " + M, "needs qzeros"}},
      {"group size", with(m.int4, {}), patched(kAutoRound32, {{"group_size", 48}}),
       {"module " + M, "group size 48 does not divide in_features 64"}},
      {"g_idx range", with(m.int4_asym, {}, {{"g_idx", testing::i32_tensor({64}, bad_g_idx)}}), asym,
       {"tensor " + M + ".g_idx", "model.safetensors", "g_idx[10] = 7", "outside [0, 2)"}},
      {"scales dtype", with(m.int4, {}, {{"scales", Tensor::empty(DType::F32, {2, 48})}}), kAutoRound32,
       {"tensor " + M + ".scales", "dtype F32, expected F16"}},
      {"fp8 scale grid", with(m.fp8, {}, {{"weight_scale_inv", Tensor::empty(DType::BF16, {1, 2})}}),
       json{{"quant_method", "fp8"}}, {"tensor " + M + ".weight_scale_inv", "model.safetensors", "expected [1, 1]"}},
      {"fp8 without scale", with(m.fp8, {"weight_scale_inv"}), json{{"quant_method", "fp8"}},
       {"module " + M, "without weight_scale_inv"}},
      {"scale beside a bf16 weight (dtype mismatch)",
       with(m.fp8, {}, {{"weight", testing::bf16_tensor({48, 64}, m.W)}}), json{{"quant_method", "fp8"}},
       {"tensor " + M + ".weight", "dtype BF16", M + ".weight_scale_inv exists"}},
      {"nvfp4 K not divisible by 16",
       [&](TensorList& t, const Modules&) {
         t.emplace_back("model." + M + ".weight_packed", Tensor::empty(DType::U8, {48, 12}));
         t.emplace_back("model." + M + ".weight_scale", Tensor::empty(DType::F8_E4M3, {48, 1}));
         t.emplace_back("model." + M + ".weight_global_scale", testing::f32_tensor({1}, {1.0f}));
       },
       json(), {"module " + M, "in_features 24 is not a multiple of 16"}, 24},
      {"nvfp4 scale grid", with(m.ct, {}, {{"weight_scale", Tensor::empty(DType::F8_E4M3, {48, 8})}}), json(),
       {"tensor " + M + ".weight_scale", "[48, 8]", "expected [48, 4]"}},
      {"modelopt without weight_scale_2", with(m.mo, {"weight_scale_2"}), json(), {"module " + M, "weight_scale_2"}},
      {"unknown quant_method", with(m.int4, {}), json{{"quant_method", "bitsandbytes"}},
       {"config.json: quantization_config.quant_method", "'bitsandbytes' is not supported"}},
      {"quantised against extra_config bits 16", with(m.int4, {}),
       patched(kAutoRound32, {{"extra_config", {{"model." + M, {{"bits", 16}}}}}}),
       {"module " + M, "stored as INT4", "16 bits"}},
      {"quantised against modules_to_not_convert", with(m.fp8, {}),
       json{{"quant_method", "fp8"}, {"modules_to_not_convert", {"experts.0.up_proj"}}},
       {"module " + M, "stored as fp8-block", "declares it unquantised by modules_to_not_convert 'experts.0.up_proj'"}},
      {"stray tensor only", with(m.int4, {"qweight", "qzeros"}), kAutoRound32, {"module " + M, "has " + M + ".scales"}},
      {"missing module", [](TensorList& t, const Modules&) { t.emplace_back("model.other.weight", Tensor::empty(DType::BF16, {1, 1})); },
       json(), {"missing tensor " + M + ".weight"}},
  };
  for (const Corruption& c : cases) {
    TensorList t;
    c.build(t, m);
    const Fixture f(t, c.config);
    const std::string error = f.error(M, 48, c.k);
    std::printf("  [%s] %s\n", c.what.c_str(), error.c_str());
    EXPECT_FALSE(error.empty()) << c.what << ": loaded without an error";
    for (const std::string& phrase : c.phrases) EXPECT_THAT(error, HasSubstr(phrase)) << c.what;
    if (c.what != "unknown quant_method") EXPECT_THAT(error, HasSubstr(f.dir())) << c.what;
  }
}

TEST(LinearLoaderErrors, Fp8WeightWithAPerTensorScaleIsNotMistakenForBlockScaling) {
  Modules m;
  TensorList t{{"model.layers.0.self_attn.q_proj.weight", m.fp8.tensors.at("weight")},
               {"model.layers.0.self_attn.q_proj.weight_scale", testing::f32_tensor({}, {0.5f})}};
  EXPECT_THAT(Fixture(t, json()).error("layers.0.self_attn.q_proj", m.N, m.K),
              AllOf(HasSubstr("weight_scale is not supported"), HasSubstr("layers.0.self_attn.q_proj")));
}

}  // namespace
}  // namespace moeserve::quant
