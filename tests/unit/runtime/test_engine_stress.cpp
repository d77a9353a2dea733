// Hundreds of random requests against a tiny cache (so preemption happens all the time),
// submitted from several threads while another cancels some of them at random moments.
// Every request must end exactly once; the ones not cancelled with exactly the tokens of
// the request run alone; and every KV block and state slot must come back.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine_test_util.h"

namespace moeserve::runtime {
namespace {

using testing::HashModel;
using testing::Recorder;
using testing::Reference;

constexpr int64_t kVocab = 64;
constexpr int kMaxModelLen = 96;

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::shared_ptr<Recorder> rec = Recorder::create();
  std::atomic<uint64_t> id{0};
  std::atomic<int> cancelled_with{-1};  // FinishReason asked for, -1: not cancelled
};

SamplingParams random_params(std::mt19937& rng, int prompt_len) {
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto chance = [&](double p) { return uniform(0, 1) < p; };
  SamplingParams p;
  const int room = kMaxModelLen - prompt_len;
  p.max_tokens = std::uniform_int_distribution<int>(1, std::min(room, 40))(rng);
  if (chance(0.5)) {
    p.temperature = 0.0;
  } else {
    p.temperature = uniform(0.3, 1.5);
    if (chance(0.5)) p.top_p = uniform(0.5, 1.0);
    if (chance(0.3)) p.top_k = std::uniform_int_distribution<int>(1, 20)(rng);
    if (chance(0.3)) p.min_p = uniform(0.0, 0.3);
  }
  p.seed = rng();
  if (chance(0.3)) p.presence_penalty = uniform(-1, 1);
  if (chance(0.3)) p.frequency_penalty = uniform(-1, 1);
  if (chance(0.3)) p.repetition_penalty = uniform(0.8, 1.5);
  if (chance(0.2)) p.logit_bias[int32_t(rng() % kVocab)] = float(uniform(-5, 5));
  p.ignore_eos = chance(0.5);
  if (chance(0.3)) p.stop_token_ids = {int32_t(1 + rng() % (kVocab - 1))};
  if (chance(0.3)) p.min_tokens = std::uniform_int_distribution<int>(0, p.max_tokens)(rng);
  if (chance(0.2)) p.logprobs = int(rng() % 4);
  return p;
}

void run_stress(int num_requests, int sampler_threads, uint32_t seed) {
  EngineConfig config;
  config.max_num_seqs = 6;
  config.max_num_batched_tokens = 16;
  config.max_model_len = kMaxModelLen;
  config.num_kv_blocks_override = 30;  // 120 tokens: one full sequence (24 blocks) and change
  config.num_state_slots_override = 6;
  config.kv_admission_watermark = 0.0;
  config.sampler_threads = sampler_threads;
  HashModel::Options options;
  options.vocab = kVocab;
  options.eos = {0};
  options.forward_delay = std::chrono::microseconds(40);  // leaves the canceller time to act
  auto model = std::make_unique<HashModel>(options);
  Engine engine(std::move(model), config);

  std::mt19937 rng(seed);
  std::vector<std::unique_ptr<Job>> jobs;
  for (int i = 0; i < num_requests; ++i) {
    auto job = std::make_unique<Job>();
    const int len = std::uniform_int_distribution<int>(1, 50)(rng);
    for (int k = 0; k < len; ++k) job->prompt.push_back(int32_t(rng() % kVocab));
    job->params = random_params(rng, len);
    jobs.push_back(std::move(job));
  }

  // Three submitters, each taking every third job, with random pauses.
  std::atomic<int> submitted{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < 3; ++t) {
    submitters.emplace_back([&, t] {
      std::mt19937 local(seed + 100 + uint32_t(t));
      for (size_t i = size_t(t); i < jobs.size(); i += 3) {
        Job& job = *jobs[i];
        job.id = engine.submit(job.prompt, job.params, job.rec->callback());
        ++submitted;
        if (local() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(local() % 300));
        // Now and then a bad request, which must be refused without disturbing anything.
        if (local() % 25 == 0) EXPECT_THROW(engine.submit({int32_t(kVocab)}, {}, nullptr), Error);
      }
    });
  }
  // One canceller: about 15% of the requests, at random moments of their lives.
  std::atomic<bool> stop_cancelling{false};
  std::thread canceller([&] {
    std::mt19937 local(seed + 7);
    while (!stop_cancelling) {
      const size_t i = local() % jobs.size();
      const uint64_t id = jobs[i]->id;
      if (id != 0 && !jobs[i]->rec->done() && local() % 5 == 0 && jobs[i]->cancelled_with < 0) {
        const FinishReason why = local() % 2 ? FinishReason::Abort : FinishReason::Stop;
        jobs[i]->cancelled_with = int(why);
        engine.cancel(id, why);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50 + local() % 200));
    }
  });
  for (auto& t : submitters) t.join();
  while (engine.stats().running > 0 && engine.stats().requests_finished_total < num_requests * 9 / 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop_cancelling = true;
  canceller.join();

  int completed = 0, cancelled = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& job = *jobs[i];
    ASSERT_TRUE(job.rec->wait(std::chrono::seconds(60))) << "request " << i << " never finished";
    EXPECT_EQ(job.rec->outputs_after_final(), 0);
    const RequestOutput last = job.rec->last();
    const std::vector<int32_t> tokens = job.rec->tokens();
    const Reference ref = testing::reference_run(job.prompt, job.params, kVocab, {0}, kMaxModelLen);
    EXPECT_EQ(last.num_generated_tokens, int(tokens.size()));
    EXPECT_EQ(last.num_prompt_tokens, int(job.prompt.size()));
    const bool cancelled_before_end =
        job.cancelled_with >= 0 && last.finish == FinishReason(job.cancelled_with.load()) && last.new_tokens.empty();
    if (cancelled_before_end) {
      ++cancelled;
      ASSERT_LE(tokens.size(), ref.tokens.size());
      EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), ref.tokens.begin())) << "request " << i;
      continue;
    }
    ++completed;
    EXPECT_TRUE(last.error.empty()) << "request " << i << ": " << last.error;
    EXPECT_EQ(tokens, ref.tokens) << "request " << i;
    EXPECT_EQ(last.finish, ref.finish) << "request " << i;
    EXPECT_EQ(last.stop_token, ref.stop_token) << "request " << i;
    if (job.params.logprobs >= 0) {
      for (const RequestOutput& out : job.rec->outputs()) EXPECT_EQ(out.logprobs.size(), out.new_tokens.size());
    }
  }
  EXPECT_GT(completed, num_requests / 4);
  EXPECT_GT(cancelled, 0);

  Engine::Stats stats;
  for (int i = 0; i < 1000; ++i) {
    stats = engine.stats();
    if (stats.free_kv_blocks == stats.total_kv_blocks && stats.running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.waiting, 0);
  EXPECT_EQ(stats.free_kv_blocks, stats.total_kv_blocks);
  EXPECT_EQ(stats.free_state_slots, stats.total_state_slots);
  EXPECT_EQ(stats.requests_finished_total, num_requests);
  EXPECT_GT(stats.num_preemptions, 0) << "the cache was meant to be too small";
  std::printf("stress: %d requests, %d completed, %d cancelled, %lld preemptions, %lld steps\n", num_requests,
              completed, cancelled, (long long)stats.num_preemptions, (long long)stats.num_steps);
}

TEST(EngineStress, RandomRequestsCancellationsAndPreemption) { run_stress(400, 1, 2024); }

TEST(EngineStress, WithParallelSampling) { run_stress(200, 3, 77); }

}  // namespace
}  // namespace moeserve::runtime
