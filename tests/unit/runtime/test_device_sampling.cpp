// Sampling on the model's device (issue 6), CPU side: the contract (model::DeviceSampleParams)
// as runtime::Sampler::sample_row implements it, the routing of requests between the host
// and the device (runtime::to_device_sample), and the engine driving a model that samples
// through the same contract: its results must be the host sampler's, RNG stream included.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "engine_test_util.h"
#include "runtime/sampler.h"
#include "runtime/step_executor.h"

namespace moeserve::runtime {
namespace {

using testing::HashModel;
using testing::Recorder;

// A HashModel that samples the rows it is asked to on its "device" with the CPU
// implementation of the contract, and returns no logits row for them.
class DeviceSamplingHashModel : public HashModel {
 public:
  using HashModel::HashModel;
  bool supports_device_sampling() const override { return true; }

  void forward(std::span<const model::SeqStep> batch, model::StepOutput& out) override {
    HashModel::forward(batch, out);  // a row for every step (every token for all_logits)
    const int64_t V = out.vocab;
    std::vector<float> kept;
    std::vector<int64_t> first(batch.size()), num(batch.size());
    out.samples.assign(batch.size(), {});
    int64_t rows = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto all = std::span<const float>(out.logits).subspan(size_t(out.first_row[i] * V), size_t(out.num_rows[i] * V));
      first[i] = rows;
      if (batch[i].device_sample) {
        if (batch[i].all_logits) throw std::logic_error("device_sample with all_logits");
        ++device_rows_;
        model::DeviceSampleResult& r = out.samples[i];
        try {
          const SampleResult s = sampler_.sample_row(all.subspan(all.size() - size_t(V)), *batch[i].device_sample);
          r.token = s.token;
          if (s.logprob) {
            r.logprob = s.logprob->logprob;
            r.top = s.logprob->top;
          }
        } catch (const Error&) {
          r.token = -1;
        }
        num[i] = 0;
      } else {
        ++host_rows_;
        kept.insert(kept.end(), all.begin(), all.end());
        num[i] = out.num_rows[i];
        rows += num[i];
      }
    }
    out.logits = std::move(kept);
    out.first_row = std::move(first);
    out.num_rows = std::move(num);
  }

  int64_t device_rows() const { return device_rows_; }
  int64_t host_rows() const { return host_rows_; }

 private:
  Sampler sampler_;
  std::atomic<int64_t> device_rows_{0}, host_rows_{0};
};

std::vector<float> random_row(int64_t vocab, std::mt19937_64& gen, bool with_ties) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (auto& x : row) x = with_ties ? std::round(normal(gen)) : normal(gen);
  row[size_t(gen() % uint64_t(vocab))] = std::numeric_limits<float>::quiet_NaN();
  row[size_t(gen() % uint64_t(vocab))] = -std::numeric_limits<float>::infinity();
  return row;
}

SampleInput input_for(std::span<const float> logits, const SamplingParams& p, const TokenHistory* history,
                      int num_generated, std::span<const int64_t> eos, Rng* rng) {
  SampleInput in;
  in.logits = logits;
  in.params = &p;
  in.history = history;
  in.num_generated = num_generated;
  in.eos_token_ids = eos;
  in.rng = rng;
  return in;
}

TEST(DeviceSampling, SampleRowIsTheSamplerWithTheSameDraw) {
  const int64_t vocab = 997;
  const std::vector<int64_t> eos = {3, 500};
  std::mt19937_64 gen(11);
  Sampler host, device;
  TokenHistory history;
  history.set_prompt(std::vector<int32_t>{1, 2, 3});
  int sampled = 0;
  for (int i = 0; i < 600; ++i) {
    const auto row = random_row(vocab, gen, i % 3 == 0);
    SamplingParams p;
    p.temperature = std::array{0.0, 0.5, 1.0, 1.3}[i % 4];
    p.top_k = std::array{-1, 1, 3, 40}[(i / 4) % 4];
    p.top_p = std::array{1.0, 0.9, 0.3}[(i / 16) % 3];
    p.min_p = std::array{0.0, 0.1}[(i / 48) % 2];
    p.logprobs = std::array{-1, 0, 4}[i % 3];
    p.min_tokens = i % 5 == 0 ? 4 : 0;
    p.stop_token_ids = {7};
    const int num_generated = i % 7;
    Rng a{uint64_t(i)}, b{uint64_t(i)};
    const SampleResult want = host.sample(input_for(row, p, &history, num_generated, eos, &a));
    std::vector<int32_t> masked;
    const auto dp = to_device_sample(input_for({}, p, &history, num_generated, eos, &b), vocab, masked);
    ASSERT_TRUE(dp.has_value());
    const SampleResult got = device.sample_row(row, *dp);
    EXPECT_EQ(got.token, want.token) << "case " << i;
    ASSERT_EQ(got.logprob.has_value(), want.logprob.has_value());
    if (want.logprob) {
      EXPECT_EQ(got.logprob->logprob, want.logprob->logprob);
      EXPECT_EQ(got.logprob->top, want.logprob->top);
    }
    EXPECT_EQ(a.next_u64(), b.next_u64()) << "case " << i << ": the RNG streams diverged";
    sampled += p.greedy() ? 0 : 1;
  }
  EXPECT_GT(sampled, 400);
}

TEST(DeviceSampling, HostOnlyRequestsStayOnTheHostAndDrawNothing) {
  TokenHistory history;
  history.set_prompt(std::vector<int32_t>{1, 2});
  std::vector<int32_t> masked;
  auto routed = [&](const SamplingParams& p) {
    Rng rng(5), untouched(5);
    const auto dp = to_device_sample(input_for({}, p, &history, 0, {}, &rng), 100, masked);
    if (!dp) EXPECT_EQ(rng.next_u64(), untouched.next_u64());
    return dp.has_value();
  };
  SamplingParams p;
  EXPECT_TRUE(routed(p));
  SamplingParams rep = p;
  rep.repetition_penalty = 1.1;
  EXPECT_FALSE(routed(rep));
  SamplingParams freq = p;
  freq.frequency_penalty = 0.5;
  EXPECT_FALSE(routed(freq));
  SamplingParams pres = p;
  pres.presence_penalty = -0.5;
  EXPECT_FALSE(routed(pres));
  SamplingParams bias = p;
  bias.logit_bias[4] = 2.0f;
  EXPECT_FALSE(routed(bias));
  SamplingParams many = p;
  many.logprobs = model::kMaxDeviceLogprobs + 1;
  EXPECT_FALSE(routed(many));
  many.logprobs = model::kMaxDeviceLogprobs;
  EXPECT_TRUE(routed(many));
}

TEST(DeviceSampling, GreedyDrawsNothingAndSampledDrawsOnce) {
  std::vector<int32_t> masked;
  SamplingParams g;
  g.temperature = 0.0;
  Rng rng(9), ref(9);
  auto dp = to_device_sample(input_for({}, g, nullptr, 0, {}, &rng), 10, masked);
  ASSERT_TRUE(dp);
  EXPECT_TRUE(dp->greedy);
  EXPECT_EQ(rng.next_u64(), ref.next_u64());

  SamplingParams s;
  s.temperature = 0.7;
  s.top_k = 5;
  s.top_p = 0.5;
  s.min_p = 0.25;
  Rng rng2(9), ref2(9);
  dp = to_device_sample(input_for({}, s, nullptr, 0, {}, &rng2), 10, masked);
  ASSERT_TRUE(dp);
  EXPECT_FALSE(dp->greedy);
  EXPECT_EQ(dp->uniform, ref2.uniform());
  EXPECT_EQ(rng2.next_u64(), ref2.next_u64());
  EXPECT_EQ(dp->inv_temperature, float(1.0 / 0.7));
  EXPECT_EQ(dp->min_log_ratio, float(std::log(0.25)));
  EXPECT_EQ(dp->top_k, 5);
  EXPECT_EQ(dp->top_p, 0.5);
}

TEST(DeviceSampling, MinTokensMasksEosAndStopTokensInTheVocabulary) {
  const std::vector<int64_t> eos = {0, 2, 1000};
  SamplingParams p;
  p.min_tokens = 3;
  p.stop_token_ids = {5, 70000, 5};
  std::vector<int32_t> masked;
  Rng rng(1);
  auto dp = to_device_sample(input_for({}, p, nullptr, 2, eos, &rng), 100, masked);
  ASSERT_TRUE(dp);
  EXPECT_EQ(std::vector<int32_t>(dp->masked_tokens.begin(), dp->masked_tokens.end()), (std::vector<int32_t>{0, 2, 5}));
  p.ignore_eos = true;
  dp = to_device_sample(input_for({}, p, nullptr, 2, eos, &rng), 100, masked);
  EXPECT_EQ(std::vector<int32_t>(dp->masked_tokens.begin(), dp->masked_tokens.end()), (std::vector<int32_t>{5}));
  dp = to_device_sample(input_for({}, p, nullptr, 3, eos, &rng), 100, masked);  // min_tokens reached
  EXPECT_TRUE(dp->masked_tokens.empty());
  for (int t = 10; t < 10 + model::kMaxDeviceMaskedTokens; ++t) p.stop_token_ids.push_back(t);
  EXPECT_FALSE(to_device_sample(input_for({}, p, nullptr, 0, eos, &rng), 100, masked));  // 17 ids: host
}

// The contract's semantics with hand-computed answers; the GPU kernel is held to the same.
model::DeviceSampleParams draw(double u, int top_k = 0, double top_p = 1.0, double min_p = 0.0) {
  model::DeviceSampleParams p;
  p.greedy = false;
  p.inv_temperature = 1.0f;
  p.uniform = u;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_log_ratio = min_p_log_ratio(min_p);
  return p;
}

TEST(DeviceSampling, TheDrawWalksTheKeptTokensInIdOrder) {
  // Weights 1, 2, 3, 4 (relative): cumulative 0.1, 0.3, 0.6, 1.0 of the total.
  const std::vector<float> logits = {std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  Sampler s;
  EXPECT_EQ(s.sample_row(logits, draw(0.05)).token, 0);
  EXPECT_EQ(s.sample_row(logits, draw(0.25)).token, 1);
  EXPECT_EQ(s.sample_row(logits, draw(0.55)).token, 2);
  EXPECT_EQ(s.sample_row(logits, draw(0.65)).token, 3);
  // top_p 0.65 keeps the two most likely (0.4 + 0.3 >= 0.65): tokens 2 and 3, in id order.
  EXPECT_EQ(s.sample_row(logits, draw(0.0, 0, 0.65)).token, 2);
  EXPECT_EQ(s.sample_row(logits, draw(0.40, 0, 0.65)).token, 2);  // 0.28 of 0.7 < 0.3
  EXPECT_EQ(s.sample_row(logits, draw(0.45, 0, 0.65)).token, 3);  // 0.315 > 0.3
  // min_p 0.6: weights of at least 0.6 x the top one: tokens 2 (0.75) and 3.
  EXPECT_EQ(s.sample_row(logits, draw(0.4, 0, 1.0, 0.6)).token, 2);
  EXPECT_EQ(s.sample_row(logits, draw(0.5, 0, 1.0, 0.6)).token, 3);
  // top_k 1 with the best token masked: token 2 is the only one left.
  model::DeviceSampleParams masked = draw(0.99, 1);
  const std::vector<int32_t> ids = {3};
  masked.masked_tokens = ids;
  EXPECT_EQ(s.sample_row(logits, masked).token, 2);
}

TEST(DeviceSampling, TopKKeepsTiesOfTheKthScaledLogit) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 0.5f};
  Sampler s;
  // top_k 1: tokens 1 and 3 tie; equal weights, so u < 0.5 picks 1 and u >= 0.5 picks 3.
  EXPECT_EQ(s.sample_row(logits, draw(0.25, 1)).token, 1);
  EXPECT_EQ(s.sample_row(logits, draw(0.75, 1)).token, 3);
  // top_p over the ties cuts by id: the first of two equal tokens holds half the mass.
  EXPECT_EQ(s.sample_row(logits, draw(0.99, 1, 0.4)).token, 1);
  // Greedy is the lowest id among the maxima.
  model::DeviceSampleParams g;
  EXPECT_EQ(s.sample_row(logits, g).token, 1);
}

TEST(DeviceSampling, MinPIsALogRatioOfTheScaledLogits) {
  EXPECT_EQ(min_p_log_ratio(0.0), -87.0f);
  EXPECT_EQ(min_p_log_ratio(1e-300), -87.0f);
  EXPECT_EQ(min_p_log_ratio(0.5), float(std::log(0.5)));
  EXPECT_EQ(min_p_log_ratio(1.0), 0.0f);
  // Temperature first: at T = 0.5 the weights 1 : e^-1 become 1 : e^-2 (0.135 < 0.2).
  const std::vector<float> logits = {0.0f, -1.0f};
  model::DeviceSampleParams p = draw(0.99, 0, 1.0, 0.2);
  Sampler s;
  EXPECT_EQ(s.sample_row(logits, p).token, 1);  // 0.368 >= 0.2: both kept, u = 0.99 takes 1
  p.inv_temperature = inverse_temperature(0.5);
  EXPECT_EQ(s.sample_row(logits, p).token, 0);
}

// ---- the engine on a device-sampling model -------------------------------------------------

constexpr int64_t kVocab = 64;

std::vector<int32_t> make_prompt(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t(1 + (i * 5 + salt * 11) % (kVocab - 1)));
  return p;
}

EngineConfig small_config() {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 32;
  c.max_model_len = 128;
  c.num_kv_blocks_override = 256;
  c.num_state_slots_override = 8;
  c.seed = 1;
  c.sampler_threads = 2;
  c.max_logprobs = 30;  // lets a request ask for more than the device takes
  return c;
}

TEST(DeviceSampling, EngineResultsEqualTheHostSamplersRngStreamIncluded) {
  HashModel::Options o;
  o.vocab = kVocab;
  auto owned = std::make_unique<DeviceSamplingHashModel>(o);
  DeviceSamplingHashModel* model = owned.get();
  Engine engine(std::move(owned), small_config());

  std::vector<SamplingParams> params;
  auto add = [&](auto edit) {
    SamplingParams p;
    p.max_tokens = 24;
    p.ignore_eos = true;
    p.seed = 100 + params.size();
    edit(p);
    params.push_back(p);
  };
  add([](SamplingParams& p) { p.temperature = 0.0; });
  add([](SamplingParams& p) { p.temperature = 0.8; });
  add([](SamplingParams& p) { p.temperature = 1.2; p.top_k = 10; p.top_p = 0.9; });
  add([](SamplingParams& p) { p.temperature = 0.6; p.min_p = 0.1; p.logprobs = 3; });
  add([](SamplingParams& p) { p.temperature = 1.0; p.min_tokens = 10; p.stop_token_ids = {9, 17}; p.ignore_eos = false; });
  add([](SamplingParams& p) { p.temperature = 0.9; p.repetition_penalty = 1.3; });  // host
  add([](SamplingParams& p) { p.temperature = 0.9; p.logit_bias = {{5, 4.0f}}; });   // host
  add([](SamplingParams& p) { p.temperature = 0.7; p.prompt_logprobs = 2; p.logprobs = 1; });
  add([](SamplingParams& p) { p.temperature = 0.0; p.ignore_eos = true; p.logprobs = 20; });
  add([](SamplingParams& p) { p.temperature = 1.0; p.logprobs = 21; });  // over the device limit: host

  std::vector<std::shared_ptr<Recorder>> recs;
  for (size_t i = 0; i < params.size(); ++i) {
    auto rec = Recorder::create();
    engine.submit(make_prompt(5 + int(i), int(i)), params[i], rec->callback());
    recs.push_back(rec);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(recs[i]->wait()) << "request " << i;
    const auto want = testing::reference_run(make_prompt(5 + int(i), int(i)), params[i], kVocab, o.eos, 128);
    EXPECT_EQ(recs[i]->tokens(), want.tokens) << "request " << i;
    EXPECT_EQ(recs[i]->last().finish, want.finish) << "request " << i;
    std::vector<TokenLogprob> got;
    for (const auto& out : recs[i]->outputs()) got.insert(got.end(), out.logprobs.begin(), out.logprobs.end());
    ASSERT_EQ(got.size(), want.logprobs.size()) << "request " << i;
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(got[j].token, want.logprobs[j].token);
      EXPECT_EQ(got[j].logprob, want.logprobs[j].logprob);
      EXPECT_EQ(got[j].top, want.logprobs[j].top);
    }
  }
  EXPECT_GT(model->device_rows(), 100);
  EXPECT_GT(model->host_rows(), 40);  // prefill chunks, penalties, logit_bias, 21 logprobs
}

// EngineConfig::device_sampling = false (serve --sampling-device host): the engine never asks
// the model to sample, and the results are still the host sampler's.
TEST(DeviceSampling, EngineConfigCanKeepSamplingOnTheHost) {
  HashModel::Options o;
  o.vocab = kVocab;
  auto owned = std::make_unique<DeviceSamplingHashModel>(o);
  DeviceSamplingHashModel* model = owned.get();
  EngineConfig config = small_config();
  config.device_sampling = false;
  Engine engine(std::move(owned), config);
  SamplingParams p;
  p.max_tokens = 16;
  p.ignore_eos = true;
  p.temperature = 0.8;
  p.seed = 7;
  auto rec = Recorder::create();
  engine.submit(make_prompt(9, 3), p, rec->callback());
  ASSERT_TRUE(rec->wait());
  const auto want = testing::reference_run(make_prompt(9, 3), p, kVocab, o.eos, 128);
  EXPECT_EQ(rec->tokens(), want.tokens);
  EXPECT_EQ(model->device_rows(), 0);
  EXPECT_GT(model->host_rows(), 15);
}

TEST(DeviceSampling, NothingToChooseOnTheDeviceFailsOnlyThatRequest) {
  HashModel::Options o;
  o.vocab = kVocab;
  o.nan_token = 62;
  Engine engine(std::make_unique<DeviceSamplingHashModel>(o), small_config());
  SamplingParams p;
  p.temperature = 0.5;
  p.seed = 3;
  p.max_tokens = 8;
  auto bad = Recorder::create();
  auto good = Recorder::create();
  engine.submit({62, 1, 2}, p, bad->callback());
  engine.submit(make_prompt(4, 1), p, good->callback());
  ASSERT_TRUE(bad->wait());
  ASSERT_TRUE(good->wait());
  EXPECT_EQ(bad->last().finish, FinishReason::Abort);
  EXPECT_NE(bad->last().error.find("sampling failed: sampling: every token is masked"), std::string::npos)
      << bad->last().error;
  EXPECT_EQ(good->tokens(), testing::reference_run(make_prompt(4, 1), p, kVocab, o.eos, 128).tokens);
}

// ---- the step executor alone ---------------------------------------------------------------

// One sequence that prefilled `prompt` and samples its next token in one step.
struct OneStep {
  explicit OneStep(HashModel& model, std::vector<int32_t> prompt, SamplingParams params) {
    model.allocate_caches(16, 2);
    seq.tokens = std::move(prompt);
    seq.num_prompt_tokens = int(seq.tokens.size());
    seq.params = std::move(params);
    seq.rng.reseed(seq.params.seed.value_or(0));
    seq.history.set_prompt(seq.tokens);
    seq.state_slot = 1;
    for (int b = 0; b < 16; ++b) seq.block_table.push_back(b);
    plan.chunks.push_back({&seq, 0, int(seq.tokens.size()), true, false});
    plan.slots_to_reset.push_back(1);
  }
  Sequence seq;
  SchedulerOutput plan;
};

TEST(DeviceSampling, TheExecutorCanKeepEveryRowOnTheHost) {
  HashModel::Options o;
  o.vocab = kVocab;
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 7;
  p.seed = 21;
  const std::vector<int32_t> prompt = make_prompt(6, 2);
  const int32_t want = testing::reference_run(prompt, p, kVocab, o.eos, 128).tokens[0];
  for (bool on : {true, false}) {
    DeviceSamplingHashModel model(o);
    StepExecutor executor(model, o.eos, 1, on);
    OneStep one(model, prompt, p);
    executor.forward(one.plan);
    EXPECT_EQ(executor.last_device_sampled(), on ? 1 : 0);
    EXPECT_EQ(model.device_rows(), on ? 1 : 0);
    const auto results = executor.sample(one.plan);
    ASSERT_TRUE(results[0].sample) << results[0].error;
    EXPECT_EQ(results[0].sample->token, want);
  }
}

// A model that answers device rows with what it is told to, for the executor's checks.
class ScriptedDeviceModel : public DeviceSamplingHashModel {
 public:
  using DeviceSamplingHashModel::DeviceSamplingHashModel;
  void forward(std::span<const model::SeqStep> batch, model::StepOutput& out) override {
    DeviceSamplingHashModel::forward(batch, out);
    if (drop_samples) out.samples.clear();
    else if (!out.samples.empty()) out.samples[0] = answer;
  }
  model::DeviceSampleResult answer;
  bool drop_samples = false;
};

TEST(DeviceSampling, TheExecutorChecksWhatTheModelSampled) {
  HashModel::Options o;
  o.vocab = kVocab;
  SamplingParams p;
  p.temperature = 0.5;
  p.logprobs = 2;
  auto run = [&](ScriptedDeviceModel& model) {
    StepExecutor executor(model, o.eos, 1);
    OneStep one(model, make_prompt(5, 1), p);
    executor.forward(one.plan);
    return executor.sample(one.plan)[0];
  };
  ScriptedDeviceModel model(o);
  model.answer.token = kVocab;  // outside the vocabulary
  EXPECT_NE(run(model).error.find("outside the vocabulary"), std::string::npos);
  model.answer.token = 3;  // two logprobs asked, none returned
  EXPECT_NE(run(model).error.find("top logprobs"), std::string::npos);
  model.answer.top = {{3, -0.5f}, {4, -1.5f}};
  model.answer.logprob = -0.5f;
  const ChunkResult ok = run(model);
  ASSERT_TRUE(ok.sample) << ok.error;
  EXPECT_EQ(ok.sample->token, 3);
  EXPECT_EQ(ok.sample->logprob->top, model.answer.top);
  model.drop_samples = true;
  EXPECT_THROW(
      {
        StepExecutor executor(model, o.eos, 1);
        OneStep one(model, make_prompt(5, 1), p);
        executor.forward(one.plan);
      },
      Error);
}

}  // namespace
}  // namespace moeserve::runtime
