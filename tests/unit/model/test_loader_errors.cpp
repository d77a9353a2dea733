// Bad checkpoints and bad steps give one clear moeserve::Error naming what is wrong.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include "checkpoint_rewrite.h"
#include "core/error.h"
#include "model/qwen35_cpu.h"

namespace moeserve::model {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kFixture = "composite_bf16_fused_sharded";  // layer 0 linear, layer 1 full attention

std::string load_error(const std::filesystem::path& dir) {
  try {
    Qwen35CpuModel::load(dir, CpuModelOptions{1, 16, true});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelLoader, MissingTensorIsNamed) {
  testing::TempDir dir("missing");
  testing::rewrite_checkpoint(kFixture, dir.path(), [](const std::string& n, const Tensor& t, testing::TensorList& out) {
    if (n != "layers.3.linear_attn.A_log") testing::keep(n, t, out);
  });
  EXPECT_THAT(load_error(dir.path()), AllOf(HasSubstr("missing tensor"), HasSubstr("layers.3.linear_attn.A_log"),
                                            HasSubstr(dir.path().string())));
}

TEST(ModelLoader, MisShapedTensorIsNamedWithFileAndShapes) {
  testing::TempDir dir("misshaped");
  testing::rewrite_checkpoint(kFixture, dir.path(), [](const std::string& n, const Tensor& t, testing::TensorList& out) {
    if (n == "layers.1.self_attn.k_proj.weight")
      out.emplace_back(n, t.slice0(0, t.dim(0) - 1));  // one output row short
    else
      testing::keep(n, t, out);
  });
  EXPECT_THAT(load_error(dir.path()),
              AllOf(HasSubstr("layers.1.self_attn.k_proj.weight"), HasSubstr("model.safetensors"), HasSubstr("[47, 72]")));
}

TEST(ModelLoader, MissingPerExpertWeightIsNamed) {
  testing::TempDir dir("missing_expert");
  testing::rewrite_checkpoint(kFixture, dir.path(), [](const std::string& n, const Tensor& t, testing::TensorList& out) {
    if (n.ends_with("experts.gate_up_proj") && n.starts_with("layers.2.")) {
      const int64_t I = t.dim(1) / 2;
      for (int64_t e = 0; e < t.dim(0); ++e) {
        if (e == 5) continue;
        out.emplace_back("layers.2.mlp.experts." + std::to_string(e) + ".gate_proj.weight", t.index0(e).slice0(0, I));
        out.emplace_back("layers.2.mlp.experts." + std::to_string(e) + ".up_proj.weight", t.index0(e).slice0(I, 2 * I));
      }
    } else if (n.ends_with("experts.down_proj") && n.starts_with("layers.2.")) {
      for (int64_t e = 0; e < t.dim(0); ++e)
        out.emplace_back("layers.2.mlp.experts." + std::to_string(e) + ".down_proj.weight", t.index0(e));
    } else {
      testing::keep(n, t, out);
    }
  });
  EXPECT_THAT(load_error(dir.path()), HasSubstr("layers.2.mlp.experts.5.gate_proj.weight"));
}

TEST(ModelLoader, TensorOfALayerBeyondTheConfigIsAnError) {
  testing::TempDir dir("extra_layer");
  testing::rewrite_checkpoint(kFixture, dir.path(), [](const std::string& n, const Tensor& t, testing::TensorList& out) {
    testing::keep(n, t, out);
    if (n == "layers.0.input_layernorm.weight") out.emplace_back("layers.6.input_layernorm.weight", t);
  });
  EXPECT_THAT(load_error(dir.path()), AllOf(HasSubstr("layer 6"), HasSubstr("num_hidden_layers = 6")));
}

TEST(ModelLoader, MtpIsOptional) {
  auto with = Qwen35CpuModel::load(testing::fixture_dir(kFixture), CpuModelOptions{1, 16, true});
  auto without = Qwen35CpuModel::load(testing::fixture_dir(kFixture), CpuModelOptions{1, 16, false});
  EXPECT_TRUE(with->has_mtp());
  EXPECT_FALSE(without->has_mtp());
  MtpOutput out;
  EXPECT_THROW(without->mtp_forward({}, out), Error);
  // One more KV layer with MTP: 3 full-attention layers x K,V x 2 heads x 16 x 24 fp32.
  EXPECT_EQ(with->cache_geometry().bytes_per_kv_block, size_t(3 * 2 * 2 * 16 * 24 * 4));
  EXPECT_EQ(without->cache_geometry().bytes_per_kv_block, size_t(2 * 2 * 2 * 16 * 24 * 4));
  // 4 linear layers x (conv 3 x conv_dim + recurrent nv·dk·dv); conv_dim = 2·2·20 + 6·12 = 152.
  EXPECT_EQ(with->cache_geometry().bytes_per_state_slot, size_t(4 * (152 * 3 + 6 * 20 * 12) * 4));
}

class BadStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Qwen35CpuModel::load(testing::fixture_dir(kFixture), CpuModelOptions{1, 4, false});
    model_->allocate_caches(8, 2);
  }
  std::string error_of(std::vector<SeqStep> batch) {
    StepOutput out;
    try {
      model_->forward(batch, out);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::unique_ptr<Qwen35CpuModel> model_;
  std::vector<int32_t> tokens_ = {1, 2, 3, 4, 5};
  std::vector<int32_t> table_ = {0, 1};
};

TEST_F(BadStepTest, TokenOutsideTheVocabulary) {
  const std::vector<int32_t> bad = {1, 263};
  EXPECT_THAT(error_of({SeqStep{bad, 0, table_, 0, false}}), HasSubstr("token id 263"));
}

TEST_F(BadStepTest, BlockTableTooShortOrOutOfRange) {
  const std::vector<int32_t> one = {0};
  EXPECT_THAT(error_of({SeqStep{tokens_, 0, one, 0, false}}), HasSubstr("block table"));
  const std::vector<int32_t> bad = {0, 8};
  EXPECT_THAT(error_of({SeqStep{tokens_, 0, bad, 0, false}}), HasSubstr("outside the pool of 8"));
}

TEST_F(BadStepTest, StateSlotOutOfRangeOrShared) {
  EXPECT_THAT(error_of({SeqStep{tokens_, 0, table_, 2, false}}), HasSubstr("slot 2"));
  const std::vector<int32_t> other = {2, 3};
  EXPECT_THAT(error_of({SeqStep{tokens_, 0, table_, 1, false}, SeqStep{tokens_, 0, other, 1, false}}),
              HasSubstr("used by two sequences"));
}

TEST_F(BadStepTest, EmptySequenceAndUnallocatedCaches) {
  EXPECT_THAT(error_of({SeqStep{{}, 0, table_, 0, false}}), HasSubstr("no tokens"));
  auto fresh = Qwen35CpuModel::load(testing::fixture_dir(kFixture), CpuModelOptions{1, 4, false});
  StepOutput out;
  const std::vector<SeqStep> batch = {SeqStep{tokens_, 0, table_, 0, false}};
  EXPECT_THROW(fresh->forward(batch, out), Error);
}

}  // namespace
}  // namespace moeserve::model
