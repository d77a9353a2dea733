// Prompt sources and the arrival schedule: determinism, lengths, dataset parsing and errors,
// and the statistics of the Poisson/Gamma gaps.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tools/bench_dataset.h"
#include "tools/bench_stats.h"

using namespace moeserve::tools;
namespace fs = std::filesystem;

TEST(BenchDataset, RandomWordPromptsAreDeterministic) {
  RandomPromptOptions o;
  o.num_prompts = 20;
  o.input_len = 50;
  o.output_len = 7;
  o.seed = 3;
  auto a = make_random_prompts(o), b = make_random_prompts(o);
  ASSERT_EQ(a.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].max_tokens, 7);
    EXPECT_EQ(a[i].planned_prompt_tokens, 50);
    // 50 words separated by single spaces.
    EXPECT_EQ(std::count(a[i].prompt.begin(), a[i].prompt.end(), ' '), 49);
  }
  EXPECT_NE(a[0].prompt, a[1].prompt);
  o.seed = 4;
  EXPECT_NE(make_random_prompts(o)[0].prompt, a[0].prompt);
}

TEST(BenchDataset, RandomLengthsAndTokenIds) {
  RandomPromptOptions o;
  o.num_prompts = 200;
  o.input_len = 100;
  o.output_len = 10;
  o.range_ratio = 0.5;
  o.token_ids = true;
  int64_t lo = 1000, hi = 0;
  for (const auto& r : make_random_prompts(o)) {
    EXPECT_TRUE(r.prompt.empty());
    EXPECT_EQ(int64_t(r.prompt_token_ids.size()), r.planned_prompt_tokens);
    lo = std::min(lo, r.planned_prompt_tokens);
    hi = std::max(hi, r.planned_prompt_tokens);
    EXPECT_GE(r.max_tokens, 5);
    EXPECT_LE(r.max_tokens, 15);
    for (int32_t id : r.prompt_token_ids) {
      EXPECT_GE(id, kRandomTokenIdLow);
      EXPECT_LT(id, kRandomTokenIdHigh);
    }
  }
  EXPECT_GE(lo, 50);
  EXPECT_LE(hi, 150);
  EXPECT_LT(lo, 60);  // 200 draws cover the range
  EXPECT_GT(hi, 140);
  o.range_ratio = 1.0;
  EXPECT_THROW(make_random_prompts(o), moeserve::Error);
}

namespace {
fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("moeserve_bench_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}
}  // namespace

TEST(BenchDataset, LoadsJsonl) {
  const auto p = write_temp("ok.jsonl",
                            "{\"prompt\": \"one\"}\n"
                            "\n"
                            "{\"prompt\": \"two\", \"max_tokens\": 5}\n"
                            "{\"messages\": [{\"role\": \"user\", \"content\": \"three\"}], \"output_len\": 9}\n");
  auto r = load_jsonl_prompts(p, 5, 32, ApiEndpoint::Chat);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[0].prompt, "one");
  EXPECT_EQ(r[0].max_tokens, 32);
  EXPECT_EQ(r[1].max_tokens, 5);
  EXPECT_EQ(r[2].messages[0]["content"], "three");
  EXPECT_EQ(r[2].max_tokens, 9);
  EXPECT_EQ(r[3].prompt, "one");  // cycles
  EXPECT_EQ(r[4].prompt, "two");
  fs::remove(p);
}

TEST(BenchDataset, JsonlErrorsNameFileAndLine) {
  auto expect_error = [](const std::string& text, const std::string& needle, ApiEndpoint e = ApiEndpoint::Chat) {
    const auto p = write_temp("bad.jsonl", text);
    try {
      load_jsonl_prompts(p, 1, 8, e);
      ADD_FAILURE() << "no error for: " << text;
    } catch (const moeserve::Error& err) {
      EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
    }
    fs::remove(p);
  };
  expect_error("{\"prompt\": \"a\"}\n{oops\n", "bad.jsonl:2: not a JSON object");
  expect_error("{\"text\": \"a\"}\n", ":1: expected a \"prompt\" or a \"messages\" field");
  expect_error("{\"prompt\": 3}\n", "\"prompt\" must be a string");
  expect_error("{\"prompt\": \"a\", \"max_tokens\": 0}\n", "\"max_tokens\" must be a positive integer");
  expect_error("{\"messages\": [{\"role\":\"user\",\"content\":\"x\"}]}\n", "needs --endpoint chat",
               ApiEndpoint::Completions);
  expect_error("\n\n", "holds no prompt");
  EXPECT_THROW(load_jsonl_prompts("/nonexistent/file.jsonl", 1, 8, ApiEndpoint::Chat), moeserve::Error);
}

TEST(BenchDataset, ArrivalTimes) {
  auto inf = make_arrival_times(5, std::numeric_limits<double>::infinity(), 1.0, 0);
  EXPECT_EQ(inf, std::vector<double>(5, 0.0));

  // Poisson at 20 req/s: the schedule spans exactly n / rate; gaps are exponential with
  // mean 1/rate and coefficient of variation 1.
  const int64_t n = 4000;
  auto t = make_arrival_times(n, 20.0, 1.0, 7);
  ASSERT_EQ(int64_t(t.size()), n);
  EXPECT_NEAR(t.back(), double(n) / 20.0, 1e-9);
  std::vector<double> gaps = {t[0]};
  for (int64_t i = 1; i < n; ++i) {
    ASSERT_GE(t[size_t(i)], t[size_t(i - 1)]);
    gaps.push_back(t[size_t(i)] - t[size_t(i - 1)]);
  }
  EXPECT_NEAR(mean_of(gaps), 0.05, 1e-9);  // exact after the rescale
  EXPECT_NEAR(population_std_of(gaps) / mean_of(gaps), 1.0, 0.06);
  EXPECT_EQ(make_arrival_times(n, 20.0, 1.0, 7), t);  // deterministic
  EXPECT_NE(make_arrival_times(n, 20.0, 1.0, 8), t);

  // Burstiness 4: Gamma(4) gaps, coefficient of variation 1/sqrt(4).
  auto b = make_arrival_times(n, 20.0, 4.0, 7);
  std::vector<double> bg = {b[0]};
  for (int64_t i = 1; i < n; ++i) bg.push_back(b[size_t(i)] - b[size_t(i - 1)]);
  EXPECT_NEAR(population_std_of(bg) / mean_of(bg), 0.5, 0.04);

  EXPECT_THROW(make_arrival_times(3, 0.0, 1.0, 0), moeserve::Error);
  EXPECT_THROW(make_arrival_times(3, 1.0, 0.0, 0), moeserve::Error);
}

// The tools' generator is the runtime's (the same seeds give the same streams: demo models and
// benchmark prompts stay byte for byte what they were).
TEST(BenchRng, IsTheRuntimeGenerator) {
  Rng rng(42);
  EXPECT_EQ(rng.next_u64(), 0x15780b2e0c2ec716ull);  // test_sampler.cpp: Rng.IsXoshiro256StarStarSeededBySplitMix64
  moeserve::runtime::Rng same(7);
  Rng tools(7);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(tools.next_u64(), same.next_u64());
  EXPECT_EQ(Rng(9).uniform(), moeserve::runtime::Rng(9).uniform());
}

TEST(BenchRng, UniformAndNormalMoments) {
  Rng rng(123);
  std::vector<double> u, z, g;
  for (int i = 0; i < 100000; ++i) {
    u.push_back(rng.uniform());
    z.push_back(rng.normal());
  }
  for (int i = 0; i < 50000; ++i) g.push_back(rng.gamma(0.5));
  EXPECT_NEAR(mean_of(u), 0.5, 0.005);
  EXPECT_NEAR(population_std_of(u), std::sqrt(1.0 / 12.0), 0.005);
  EXPECT_NEAR(mean_of(z), 0.0, 0.01);
  EXPECT_NEAR(population_std_of(z), 1.0, 0.01);
  EXPECT_NEAR(mean_of(g), 0.5, 0.02);              // Gamma(k): mean k
  EXPECT_NEAR(population_std_of(g), std::sqrt(0.5), 0.03);  // variance k
  for (int i = 0; i < 1000; ++i) EXPECT_LT(rng.below(7), 7u);
  // Fixed sequence: the generator must not change silently (the demo model depends on it).
  Rng a(0);
  EXPECT_EQ(a.next_u64(), Rng(0).next_u64());
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);  // the published FNV-1a test vector
}
