// Metric math against numpy and against vLLM's calculate_metrics evaluated (in Python, with
// numpy) on the same synthetic requests. The reference values were printed by:
//   PYTHONPATH=/usr/lib/python3/dist-packages python3 -c "import numpy as np; ..."
// (the script replays vllm/benchmarks/serve.py calculate_metrics on these records).
#include <gtest/gtest.h>

#include "core/error.h"
#include "tools/bench_stats.h"

using namespace moeserve::tools;

TEST(BenchStats, MatchesNumpy) {
  const std::vector<double> x = {0.120, 0.095, 0.310, 0.101, 0.250, 0.087, 0.143};
  EXPECT_NEAR(mean_of(x), 0.15799999999999997, 1e-15);
  EXPECT_NEAR(median_of(x), 0.12, 1e-15);
  EXPECT_NEAR(population_std_of(x), 0.08061903355553558, 1e-15);  // np.std
  EXPECT_NEAR(sample_std_of(x), 0.08707850863827807, 1e-15);      // np.std(ddof=1)
  EXPECT_NEAR(percentile_of(x, 50), 0.12, 1e-15);
  EXPECT_NEAR(percentile_of(x, 90), 0.274, 1e-15);
  EXPECT_NEAR(percentile_of(x, 99), 0.30639999999999995, 1e-15);
  EXPECT_NEAR(percentile_of(x, 99.9), 0.30964, 1e-15);
  EXPECT_NEAR(percentile_of(x, 25), 0.098, 1e-15);
  const std::vector<double> y = {3.0, 1.0, 4.0, 1.5};
  EXPECT_DOUBLE_EQ(median_of(y), 2.25);
  EXPECT_NEAR(percentile_of(y, 90), 3.7, 1e-15);
  EXPECT_NEAR(percentile_of(y, 33.3), 1.4994999999999998, 1e-15);
}

TEST(BenchStats, EmptySamplesAreZero) {
  const std::vector<double> none;
  EXPECT_EQ(mean_of(none), 0);
  EXPECT_EQ(median_of(none), 0);
  EXPECT_EQ(population_std_of(none), 0);
  EXPECT_EQ(sample_std_of({1.0}), 0);
  EXPECT_EQ(percentile_of(none, 99), 0);
}

namespace {
RequestRecord ok(double start, double ttft, std::vector<double> itl, double latency, int64_t out_tokens,
                 int64_t chunks, int64_t prompt) {
  RequestRecord r;
  r.success = true;
  r.start_time = start;
  r.ttft = ttft;
  r.itl = std::move(itl);
  r.latency = latency;
  r.output_tokens = out_tokens;
  r.output_chunks = chunks;
  r.prompt_tokens = prompt;
  return r;
}
}  // namespace

TEST(BenchStats, ComputeMetricsLikeVllm) {
  std::vector<RequestRecord> recs;
  recs.push_back(ok(0.0, 0.2, {0.05, 0.05, 0.1}, 0.45, 4, 4, 10));
  recs.push_back(ok(0.5, 0.3, {0.1, 0.2}, 0.7, /*no usage*/ 0, 3, 20));  // counts 3 chunks
  RequestRecord failed;
  failed.error = "HTTP 500";
  recs.push_back(failed);
  recs.push_back(ok(1.2, 0.1, {}, 0.1, 1, 1, 5));  // starts exactly when request 1 ends

  GoodputSlo slo;
  slo.ttft_ms = 250;
  slo.tpot_ms = 100;
  const auto m = compute_metrics(recs, 2.0, {90, 99}, slo);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 35);
  EXPECT_EQ(m.total_output, 8);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{4, 3, 0, 1}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 4.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 21.5);
  EXPECT_DOUBLE_EQ(m.request_goodput, 1.0);

  const double tol = 1e-9;
  EXPECT_NEAR(m.ttft.mean_ms, 200.0, tol);
  EXPECT_NEAR(m.ttft.median_ms, 200.0, tol);
  EXPECT_NEAR(m.ttft.std_ms, 81.6496580927726, tol);
  EXPECT_NEAR(m.ttft.percentiles_ms[0].second, 280.0, tol);
  EXPECT_NEAR(m.ttft.percentiles_ms[1].second, 298.0, tol);
  EXPECT_NEAR(m.tpot.mean_ms, 141.66666666666666, tol);
  EXPECT_NEAR(m.tpot.std_ms, 58.33333333333333, tol);
  EXPECT_NEAR(m.tpot.percentiles_ms[0].second, 188.33333333333331, tol);
  EXPECT_NEAR(m.tpot.percentiles_ms[1].second, 198.83333333333331, tol);
  EXPECT_NEAR(m.itl.mean_ms, 100.0, tol);
  EXPECT_NEAR(m.itl.median_ms, 100.0, tol);
  EXPECT_NEAR(m.itl.std_ms, 54.772255750516614, tol);
  EXPECT_NEAR(m.itl.percentiles_ms[0].second, 160.0, tol);
  EXPECT_NEAR(m.itl.percentiles_ms[1].second, 196.0, tol);
  EXPECT_NEAR(m.e2el.mean_ms, 416.6666666666667, tol);
  EXPECT_NEAR(m.e2el.median_ms, 450.0, tol);
  EXPECT_NEAR(m.e2el.std_ms, 246.08038433722328, tol);
  EXPECT_NEAR(m.e2el.percentiles_ms[0].second, 650.0, tol);
  EXPECT_NEAR(m.e2el.percentiles_ms[1].second, 695.0, tol);
  // Second 0 holds 4 + 2 chunks, second 1 holds 1 + 1.
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 6.0);
  // [0, 0.45), [0.5, 1.2), [1.2, 1.3): half-open, so never two at once.
  EXPECT_EQ(m.max_concurrent_requests, 1);
}

TEST(BenchStats, PeakConcurrencyCountsOverlap) {
  std::vector<RequestRecord> recs = {ok(0.0, 0.1, {}, 1.0, 1, 1, 1), ok(0.2, 0.1, {}, 1.0, 1, 1, 1),
                                     ok(0.3, 0.1, {}, 0.1, 1, 1, 1), ok(1.5, 0.1, {}, 0.1, 1, 1, 1)};
  EXPECT_EQ(compute_metrics(recs, 2.0, {}).max_concurrent_requests, 3);
}

TEST(BenchStats, ParsesOptions) {
  EXPECT_EQ(parse_percentiles("50,90,99.9"), (std::vector<double>{50, 90, 99.9}));
  EXPECT_THROW(parse_percentiles("50,abc"), moeserve::Error);
  EXPECT_THROW(parse_percentiles("0"), moeserve::Error);
  EXPECT_THROW(parse_percentiles("101"), moeserve::Error);
  auto slo = parse_goodput({"ttft:500", "e2el:2000.5"});
  EXPECT_EQ(*slo.ttft_ms, 500);
  EXPECT_FALSE(slo.tpot_ms.has_value());
  EXPECT_EQ(*slo.e2el_ms, 2000.5);
  EXPECT_THROW(parse_goodput({"ttft=5"}), moeserve::Error);
  EXPECT_THROW(parse_goodput({"itl:5"}), moeserve::Error);
  EXPECT_THROW(parse_goodput({"tpot:-1"}), moeserve::Error);
  EXPECT_THROW(parse_goodput({"tpot:5ms"}), moeserve::Error);
}
