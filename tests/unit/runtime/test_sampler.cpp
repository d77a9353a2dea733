// Sampler against reference values from sampler_reference.py (an independent float64
// implementation of vLLM's v1 sampling semantics; the numbers below are its output).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"

namespace moeserve::runtime {
namespace {

const std::vector<float> kLogits = {1.5f, -0.25f, 3.0f, 0.0f, 2.0f, -1.0f, 2.0f, 0.5f};

SampleInput input_for(const std::vector<float>& logits, const SamplingParams& p, const TokenHistory* history,
                      Rng& rng, std::span<const int64_t> eos = {}, int num_generated = 0) {
  SampleInput in;
  in.logits = logits;
  in.params = &p;
  in.history = history;
  in.rng = &rng;
  in.eos_token_ids = eos;
  in.num_generated = num_generated;
  return in;
}

// Draws n samples and compares the frequencies with the expected distribution (5 sigma).
void expect_distribution(const SamplingParams& p, const std::vector<double>& expected, int n = 200'000) {
  Sampler sampler;
  Rng rng(1234);
  std::vector<int> counts(kLogits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[size_t(sampler.sample(input_for(kLogits, p, nullptr, rng)).token)];
  for (size_t t = 0; t < expected.size(); ++t) {
    const double freq = double(counts[t]) / n;
    if (expected[t] == 0.0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " must never be sampled";
    } else {
      const double sigma = std::sqrt(expected[t] * (1 - expected[t]) / n);
      EXPECT_NEAR(freq, expected[t], 5 * sigma) << "token " << t;
    }
  }
}

TEST(Sampler, LogprobsAreTheRawLogSoftmaxWithTopAlternatives) {
  const std::vector<double> ref = {-2.26446779, -4.01446779, -0.764467787, -3.76446779,
                                   -1.76446779, -4.76446779, -1.76446779,  -3.26446779};
  for (int32_t t = 0; t < 8; ++t) {
    EXPECT_NEAR(compute_logprobs(kLogits, t, 0).logprob, ref[size_t(t)], 1e-6);
  }
  const TokenLogprob lp = compute_logprobs(kLogits, 5, 3);
  EXPECT_EQ(lp.token, 5);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 2);
  EXPECT_EQ(lp.top[1].first, 4);  // 4 and 6 tie: lower id first
  EXPECT_EQ(lp.top[2].first, 6);
  EXPECT_NEAR(lp.top[0].second, ref[2], 1e-6);
  EXPECT_NEAR(lp.top[2].second, ref[6], 1e-6);
  EXPECT_EQ(compute_logprobs(kLogits, 0, 100).top.size(), 8u);
}

TEST(Sampler, LogprobsComeFromTheRawLogitsNotTheProcessedOnes) {
  SamplingParams p;
  p.temperature = 0.5;
  p.repetition_penalty = 2.0;
  p.logit_bias[0] = 5.0f;
  p.logprobs = 2;
  TokenHistory history;
  history.set_prompt(std::vector<int32_t>{2});
  Sampler sampler;
  Rng rng(7);
  const SampleResult r = sampler.sample(input_for(kLogits, p, &history, rng));
  ASSERT_TRUE(r.logprob.has_value());
  EXPECT_EQ(r.logprob->token, r.token);
  EXPECT_NEAR(r.logprob->logprob, compute_logprobs(kLogits, r.token, 0).logprob, 1e-7);
  ASSERT_EQ(r.logprob->top.size(), 2u);
  EXPECT_EQ(r.logprob->top[0].first, 2);
}

TEST(Sampler, BiasAndPenaltiesFollowVllm) {
  SamplingParams p;
  p.repetition_penalty = 1.3;
  p.frequency_penalty = 0.4;
  p.presence_penalty = 0.7;
  p.logit_bias = {{1, 2.5f}, {6, -1.0f}};
  TokenHistory history;
  history.set_prompt(std::vector<int32_t>{0, 3});
  for (int32_t t : {2, 2, 5, 3}) history.add_output(t);
  Sampler sampler;
  Rng rng(0);
  const std::vector<float>& out = sampler.process_logits(input_for(kLogits, p, &history, rng));
  const std::vector<double> ref = {1.15384615, 2.25, 0.807692308, -1.1, 2, -2.4, 1, 0.5};
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(out[i], ref[i], 1e-5) << "token " << i;

  // Greedy takes the argmax of the processed logits: token 1 (2.25) rather than 2.
  p.temperature = 0.0;
  EXPECT_EQ(sampler.sample(input_for(kLogits, p, &history, rng)).token, 1);
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTiesAndUsesNoRandomness) {
  SamplingParams p;
  p.temperature = 0.0;
  Sampler sampler;
  Rng rng(99), untouched(99);
  EXPECT_EQ(sampler.sample(input_for(kLogits, p, nullptr, rng)).token, 2);
  const std::vector<float> tied = {0.0f, 4.0f, 1.0f, 4.0f};
  EXPECT_EQ(sampler.sample(input_for(tied, p, nullptr, rng)).token, 1);
  EXPECT_EQ(rng.next_u64(), untouched.next_u64());
}

TEST(Sampler, MinTokensMasksEosAndStopTokens) {
  SamplingParams p;
  p.temperature = 0.0;
  p.min_tokens = 2;
  p.stop_token_ids = {4};
  const std::vector<int64_t> eos = {2};
  Sampler sampler;
  Rng rng(0);
  // Tokens 2 (eos) and 4 (stop) are masked: 6 wins (2.0, tied with 4 but 4 is masked).
  EXPECT_EQ(sampler.sample(input_for(kLogits, p, nullptr, rng, eos, 0)).token, 6);
  EXPECT_EQ(sampler.sample(input_for(kLogits, p, nullptr, rng, eos, 1)).token, 6);
  EXPECT_EQ(sampler.sample(input_for(kLogits, p, nullptr, rng, eos, 2)).token, 2);
  // With ignore_eos the eos token is an ordinary token, so it is not masked.
  p.ignore_eos = true;
  EXPECT_EQ(sampler.sample(input_for(kLogits, p, nullptr, rng, eos, 0)).token, 2);
}

TEST(Sampler, PlainTemperatureOneMatchesSoftmax) {
  SamplingParams p;
  expect_distribution(p, {0.103885309, 0.0180525598, 0.465581654, 0.0231799456, 0.171277919, 0.00852742544,
                          0.171277919, 0.0382172694});
}

TEST(Sampler, MinPAfterTemperature) {
  SamplingParams p;
  p.temperature = 0.7;
  p.min_p = 0.2;
  expect_distribution(p, {0, 0, 0.675994456, 0, 0.162002772, 0, 0.162002772, 0});
}

TEST(Sampler, TopK) {
  SamplingParams p;
  p.temperature = 1.3;
  p.top_k = 3;
  expect_distribution(p, {0, 0, 0.519011727, 0, 0.240494137, 0, 0.240494137, 0});
  p.temperature = 1.0;
  p.top_k = 2;  // 4 and 6 tie for second place: both stay
  expect_distribution(p, {0, 0, 0.576116885, 0, 0.211941558, 0, 0.211941558, 0});
}

TEST(Sampler, TopP) {
  SamplingParams p;
  p.top_p = 0.8;
  expect_distribution(p, {0, 0, 0.576116885, 0, 0.211941558, 0, 0.211941558, 0});
}

TEST(Sampler, TopKTopPMinPTogether) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 5;
  p.top_p = 0.75;
  p.min_p = 0.1;
  expect_distribution(p, {0, 0, 0.602995934, 0, 0.198502033, 0, 0.198502033, 0});
}

TEST(Sampler, TopPOverManyEqualTokensKeepsExactlyTheMass) {
  // 1000 equally likely tokens: top_p 0.9 must keep exactly 900 of them, the lowest ids.
  const std::vector<float> flat(1000, 0.0f);
  SamplingParams p;
  p.top_p = 0.9;
  Sampler sampler;
  Rng rng(5);
  int max_token = 0;
  for (int i = 0; i < 5000; ++i) max_token = std::max(max_token, sampler.sample(input_for(flat, p, nullptr, rng)).token);
  EXPECT_GE(max_token, 890);  // ties keep the lowest ids: 0..899
  EXPECT_LE(max_token, 899);
}

// xoshiro256** seeded by four splitmix64 steps from the seed: the first outputs, computed by an
// independent implementation of the published algorithms (Blackman and Vigna), pin the stream
// that every seeded request's samples come from.
TEST(Rng, IsXoshiro256StarStarSeededBySplitMix64) {
  Rng zero(0), answer(42);
  EXPECT_EQ(zero.next_u64(), 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(zero.next_u64(), 0xbf6e1f784956452aull);
  EXPECT_EQ(zero.next_u64(), 0x1a5f849d4933e6e0ull);
  EXPECT_EQ(answer.next_u64(), 0x15780b2e0c2ec716ull);
  EXPECT_EQ(answer.next_u64(), 0x6104d9866d113a7eull);
  EXPECT_EQ(answer.next_u64(), 0xae17533239e499a1ull);
}

TEST(Sampler, SameSeedSameSamples) {
  SamplingParams p;
  Sampler a, b;
  Rng r1(42), r2(42), r3(43);
  std::vector<int32_t> s1, s2, s3;
  for (int i = 0; i < 64; ++i) {
    s1.push_back(a.sample(input_for(kLogits, p, nullptr, r1)).token);
    s2.push_back(b.sample(input_for(kLogits, p, nullptr, r2)).token);
    s3.push_back(a.sample(input_for(kLogits, p, nullptr, r3)).token);
  }
  EXPECT_EQ(s1, s2);
  EXPECT_NE(s1, s3);
}

TEST(Sampler, NanLogitsAreExcludedAndAllMaskedIsAnError) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> some_nan = {nan, 1.0f, nan, 0.5f};
  SamplingParams p;
  p.temperature = 0.0;
  Sampler sampler;
  Rng rng(0);
  EXPECT_EQ(sampler.sample(input_for(some_nan, p, nullptr, rng)).token, 1);
  p.temperature = 1.0;
  for (int i = 0; i < 100; ++i) {
    const int32_t t = sampler.sample(input_for(some_nan, p, nullptr, rng)).token;
    EXPECT_TRUE(t == 1 || t == 3);
  }
  const std::vector<float> all_nan(4, nan);
  EXPECT_THROW(sampler.sample(input_for(all_nan, p, nullptr, rng)), Error);
  p.temperature = 0.0;
  EXPECT_THROW(sampler.sample(input_for(all_nan, p, nullptr, rng)), Error);
}

}  // namespace
}  // namespace moeserve::runtime

namespace moeserve::runtime {
namespace {

TEST(Sampler, TopPCutEqualsTheSortedPrefix) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + int(rng() % 3000);
    std::vector<float> w(static_cast<size_t>(n));
    // Few distinct values, so ties are common and the id order matters.
    for (float& x : w) x = float(1 + rng() % (trial % 2 ? 5 : 1000)) / 7.0f;
    std::vector<int32_t> cand(static_cast<size_t>(n));
    std::iota(cand.begin(), cand.end(), 0);
    std::shuffle(cand.begin(), cand.end(), rng);
    double total = 0.0;
    for (float x : w) total += x;
    const double target = total * (0.05 + 0.9 * double(rng() % 1000) / 1000.0);

    std::vector<int32_t> sorted(static_cast<size_t>(n));
    std::iota(sorted.begin(), sorted.end(), 0);
    std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) { return w[a] != w[b] ? w[a] > w[b] : a < b; });
    size_t want = 0;
    double acc = 0.0;
    while (want < sorted.size() && acc < target) acc += w[size_t(sorted[want++])];

    const size_t got = top_p_cut(cand, w.data(), target);
    ASSERT_EQ(got, want) << "trial " << trial;
    std::vector<int32_t> kept(cand.begin(), cand.begin() + ptrdiff_t(got));
    std::sort(kept.begin(), kept.end());
    std::vector<int32_t> expected(sorted.begin(), sorted.begin() + ptrdiff_t(want));
    std::sort(expected.begin(), expected.end());
    ASSERT_EQ(kept, expected) << "trial " << trial;
  }
}

}  // namespace
}  // namespace moeserve::runtime
