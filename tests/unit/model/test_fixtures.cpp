// The CPU model against transformers 5.17 on every fixture in tests/fixtures/qwen35:
// teacher-forced logits and post-norm hidden states (1e-4 relative), the greedy
// continuation (identical tokens), and the MTP draft logits/hidden where present.
#include <cstdio>

#include <gtest/gtest.h>

#include "core/error.h"
#include "fixture_util.h"
#include "model/qwen35_cpu.h"
#include "model/sequence_runner.h"

namespace moeserve::model {
namespace {
using testing::Reference;
using testing::rel_diff;

constexpr double kTolerance = 1e-4;

class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Quantised fixtures (INT4 GPTQ/AutoRound, FP8 block, hybrid, NVFP4) load through
  // quant::LinearLoader like any other; their reference model holds the exactly dequantised
  // weights, so the same tolerance applies.
  void SetUp() override { model_ = Qwen35CpuModel::load(testing::fixture_dir(GetParam()), CpuModelOptions{2, 16, true}); }
  std::unique_ptr<Qwen35CpuModel> model_;
};

TEST_P(FixtureTest, TeacherForcedLogitsAndHiddenMatchTransformers) {
  const Reference ref(GetParam());
  const auto ids = ref.ids("input_ids");
  SequenceRunner runner(*model_, int64_t(ids.size()));
  std::vector<float> hidden;
  const auto logits = runner.append(ids, int64_t(ids.size()), true, &hidden);
  const double d_logits = rel_diff(logits, ref.floats("logits")), d_hidden = rel_diff(hidden, ref.floats("hidden"));
  RecordProperty("logits_rel_diff", std::to_string(d_logits));
  std::printf("  [%s] teacher-forced logits rel diff %.3g, hidden %.3g\n", GetParam().c_str(), d_logits, d_hidden);
  EXPECT_LT(d_logits, kTolerance);
  EXPECT_LT(d_hidden, kTolerance);
}

TEST_P(FixtureTest, GreedyContinuationMatchesTransformers) {
  const Reference ref(GetParam());
  const auto prompt = ref.ids("greedy_prompt_ids");
  const auto expected = ref.ids("greedy_output_ids");
  SequenceRunner runner(*model_, int64_t(prompt.size() + expected.size()));
  std::vector<float> logits = runner.append(prompt, 512, false);
  std::vector<int32_t> generated;
  for (size_t i = 0; i < expected.size(); ++i) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    generated.push_back(next);
    if (i + 1 < expected.size()) logits = runner.append(std::span(&next, 1), 1, false);
  }
  EXPECT_EQ(generated, expected);
}

TEST_P(FixtureTest, MtpDraftLogitsMatchReference) {
  const Reference ref(GetParam());
  if (!ref.has("mtp_logits")) GTEST_SKIP() << "fixture has no MTP reference";
  ASSERT_TRUE(model_->has_mtp());
  const auto ids = ref.ids("input_ids");
  const int64_t T = int64_t(ids.size()), H = model_->config().hidden_size;
  SequenceRunner runner(*model_, T);
  std::vector<float> hidden;
  runner.append(ids, T, false, &hidden);
  // Row p: hidden[p], token ids[p + 1], position p, for p = 0..T-2, in one causal pass.
  MtpStep step;
  step.hidden = std::span<const float>(hidden.data(), size_t((T - 1) * H));
  step.next_tokens = std::span<const int32_t>(ids.data() + 1, size_t(T - 1));
  step.start_pos = 0;
  step.kv_blocks = runner.block_table();
  step.all_logits = true;
  MtpOutput out;
  model_->mtp_forward(std::span(&step, 1), out);
  const double d_logits = rel_diff(out.logits, ref.floats("mtp_logits"));
  const double d_hidden = rel_diff(out.hidden, ref.floats("mtp_hidden"));
  std::printf("  [%s] MTP logits rel diff %.3g, hidden %.3g\n", GetParam().c_str(), d_logits, d_hidden);
  EXPECT_LT(d_logits, kTolerance);
  EXPECT_LT(d_hidden, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Qwen35, FixtureTest, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

TEST(FixtureList, TheTransformersFixturesArePresent) {
  const auto names = testing::fixture_names();
  EXPECT_GE(names.size(), 3u);
  int plain_with_mtp = 0;
  for (const auto& n : names) plain_with_mtp += !testing::is_quantized(n) && Reference(n).has("mtp_logits");
  EXPECT_GE(plain_with_mtp, 1);
}

}  // namespace
}  // namespace moeserve::model
