// The engine on the real CPU model (src/model/qwen35_cpu.h) with a tiny random Qwen3.5-MoE
// checkpoint whose references were made by transformers 5.17
// (tests/fixtures/qwen35/text_f32_perexpert, see tests/fixtures/make_qwen35_fixtures.py):
// greedy generation through the scheduler — alone, batched, chunked and preempted — must
// give transformers' greedy tokens, and prompt logprobs must be transformers' log-softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine_test_util.h"
#include "io/safetensors.h"
#include "model/qwen35_cpu.h"

namespace moeserve::runtime {
namespace {

using testing::Recorder;

const std::filesystem::path kFixture = std::filesystem::path(MOESERVE_FIXTURES_DIR) / "qwen35" / "text_f32_perexpert";

class Qwen35EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kFixture / "model.safetensors")) GTEST_SKIP() << "fixture missing: " << kFixture;
    reference_ = io::SafetensorsFile::open(kFixture / "reference.safetensors");
  }

  std::unique_ptr<Engine> make_engine(int max_num_batched_tokens, int num_kv_blocks, int max_num_seqs = 8) {
    model::CpuModelOptions options;
    options.threads = 2;
    options.kv_block_size = 16;
    options.load_mtp = false;
    EngineConfig c;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = max_num_batched_tokens;
    c.max_model_len = 128;
    c.num_kv_blocks_override = num_kv_blocks;
    c.num_state_slots_override = max_num_seqs;
    c.kv_admission_watermark = 0.0;
    return std::make_unique<Engine>(model::Qwen35CpuModel::load(kFixture, options), c);
  }

  std::vector<int32_t> ids(const std::string& name) const {
    const Tensor t = reference_->tensor(name);
    std::vector<int32_t> out(size_t(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = int32_t(t.data<int64_t>()[i]);
    return out;
  }
  std::vector<float> floats(const std::string& name) const { return reference_->tensor(name).to_f32(); }

  static SamplingParams greedy(int max_tokens) {
    SamplingParams p;
    p.temperature = 0.0;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;  // transformers generated with eos off
    return p;
  }

  std::shared_ptr<io::SafetensorsFile> reference_;
};

TEST_F(Qwen35EngineTest, GreedyGenerationMatchesTransformers) {
  const auto prompt = ids("greedy_prompt_ids");
  const auto expected = ids("greedy_output_ids");
  auto engine = make_engine(64, 64);
  auto rec = Recorder::create();
  engine->submit(prompt, greedy(int(expected.size())), rec->callback());
  ASSERT_TRUE(rec->wait(std::chrono::seconds(120)));
  EXPECT_EQ(rec->tokens(), expected);
  EXPECT_EQ(rec->last().finish, FinishReason::Length);
}

TEST_F(Qwen35EngineTest, BatchedChunkedAndPreemptedGreedyStillMatches) {
  // The transformers prompt among others built from the teacher-forcing input, with 5-token
  // prefill chunks and too few KV blocks for everyone (so some are preempted and recomputed).
  const auto prompt = ids("greedy_prompt_ids");
  const auto expected = ids("greedy_output_ids");
  const auto input = ids("input_ids");
  std::vector<std::vector<int32_t>> others;
  for (int k = 0; k < 5; ++k) others.emplace_back(input.begin() + k * 7, input.begin() + k * 7 + 10 + 4 * k);

  // Each other prompt alone first: its own greedy tokens.
  std::vector<std::vector<int32_t>> alone;
  {
    auto engine = make_engine(64, 64);
    for (const auto& p : others) {
      auto rec = Recorder::create();
      engine->submit(p, greedy(24), rec->callback());
      ASSERT_TRUE(rec->wait(std::chrono::seconds(120)));
      alone.push_back(rec->tokens());
    }
  }
  auto engine = make_engine(8, 10, 6);  // 10 blocks of 16 tokens; sequences reach 43-56 tokens
  auto main_rec = Recorder::create();
  std::vector<std::shared_ptr<Recorder>> recs;
  for (size_t k = 0; k < others.size(); ++k) {
    if (k == 2) engine->submit(prompt, greedy(int(expected.size())), main_rec->callback());
    recs.push_back(Recorder::create());
    engine->submit(others[k], greedy(24), recs.back()->callback());
  }
  ASSERT_TRUE(main_rec->wait(std::chrono::seconds(120)));
  EXPECT_EQ(main_rec->tokens(), expected);
  for (size_t k = 0; k < others.size(); ++k) {
    ASSERT_TRUE(recs[k]->wait(std::chrono::seconds(120)));
    EXPECT_EQ(recs[k]->tokens(), alone[k]) << "prompt " << k;
  }
  const Engine::Stats s = engine->stats();
  EXPECT_GT(s.num_preemptions, 0);
  EXPECT_EQ(s.free_kv_blocks, s.total_kv_blocks);
  EXPECT_EQ(s.free_state_slots, s.total_state_slots);
}

TEST_F(Qwen35EngineTest, PromptLogprobsAreTransformersLogSoftmax) {
  const auto input = ids("input_ids");
  const auto logits = floats("logits");  // [T, V] teacher-forced
  const size_t T = input.size();
  const size_t V = logits.size() / T;
  auto engine = make_engine(16, 64);  // 80 prompt tokens in 16-token chunks
  SamplingParams p = greedy(1);
  p.prompt_logprobs = 3;
  p.logprobs = 2;
  auto rec = Recorder::create();
  engine->submit(input, p, rec->callback());
  ASSERT_TRUE(rec->wait(std::chrono::seconds(120)));
  const auto outputs = rec->outputs();
  ASSERT_EQ(outputs.size(), 1u);
  const auto& plp = outputs[0].prompt_logprobs;
  ASSERT_EQ(plp.size(), T);
  EXPECT_FALSE(plp[0].has_value());
  auto log_softmax_at = [&](size_t row, int32_t token) {
    const float* r = logits.data() + row * V;
    double m = -INFINITY, s = 0.0;
    for (size_t v = 0; v < V; ++v) m = std::max(m, double(r[v]));
    for (size_t v = 0; v < V; ++v) s += std::exp(double(r[v]) - m);
    return double(r[token]) - m - std::log(s);
  };
  for (size_t i = 1; i < T; ++i) {
    ASSERT_TRUE(plp[i].has_value());
    EXPECT_EQ(plp[i]->token, input[i]);
    EXPECT_NEAR(plp[i]->logprob, log_softmax_at(i - 1, input[i]), 2e-4) << "position " << i;
    ASSERT_EQ(plp[i]->top.size(), 3u);
    EXPECT_NEAR(plp[i]->top[0].second, log_softmax_at(i - 1, plp[i]->top[0].first), 2e-4);
  }
  // The sampled token's logprob comes from the last row (position T-1).
  ASSERT_EQ(outputs[0].logprobs.size(), 1u);
  const int32_t next = outputs[0].new_tokens[0];
  EXPECT_NEAR(outputs[0].logprobs[0].logprob, log_softmax_at(T - 1, next), 2e-4);
  const float* last = logits.data() + (T - 1) * V;
  EXPECT_EQ(next, int32_t(std::max_element(last, last + V) - last)) << "greedy is transformers' argmax";
}

}  // namespace
}  // namespace moeserve::runtime
