#include <gtest/gtest.h>

#include "server/prometheus.h"
#include "server/server_metrics.h"

using namespace moeserve::server;

TEST(Prometheus, HistogramBucketsAreCumulativeWithLeSemantics) {
  prometheus::Histogram h({0.1, 1.0});
  h.observe(0.1);   // le 0.1
  h.observe(0.5);   // le 1.0
  h.observe(5.0);   // +Inf
  auto s = h.snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(s.count, 3u);
  EXPECT_DOUBLE_EQ(s.sum, 5.6);
  prometheus::TextWriter w;
  w.histogram("x_seconds", {{"model_name", "m"}}, s);
  EXPECT_EQ(w.text(),
            "x_seconds_bucket{model_name=\"m\",le=\"0.1\"} 1.0\n"
            "x_seconds_bucket{model_name=\"m\",le=\"1.0\"} 2.0\n"
            "x_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3.0\n"
            "x_seconds_count{model_name=\"m\"} 3.0\n"
            "x_seconds_sum{model_name=\"m\"} 5.6\n");
}

TEST(Prometheus, LabelValuesAreEscaped) {
  EXPECT_EQ(prometheus::escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(ServerMetrics, RendersVllmNames) {
  ServerMetrics m("qwen");
  m.observe_time_to_first_token(0.03);
  m.observe_inter_token(0.02, 2);
  m.observe_request_finished(moeserve::runtime::FinishReason::Length, 1.2, 0.4, 5);
  EngineSnapshot e;
  e.stats.running = 2;
  e.stats.waiting = 1;
  e.stats.kv_usage = 0.25;
  e.stats.prompt_tokens_total = 40;
  e.stats.generation_tokens_total = 7;
  const std::string text = m.render(e);
  for (const char* line : {
           "vllm:num_requests_running{model_name=\"qwen\"} 2.0\n",
           "vllm:num_requests_waiting{model_name=\"qwen\"} 1.0\n",
           "vllm:kv_cache_usage_perc{model_name=\"qwen\"} 0.25\n",
           "vllm:prompt_tokens_total{model_name=\"qwen\"} 40.0\n",
           "vllm:generation_tokens_total{model_name=\"qwen\"} 7.0\n",
           "vllm:request_success_total{model_name=\"qwen\",finished_reason=\"length\"} 1.0\n",
           "vllm:request_success_total{model_name=\"qwen\",finished_reason=\"stop\"} 0.0\n",
           "vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\",le=\"0.04\"} 1.0\n",
           "vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\",le=\"0.02\"} 0.0\n",
           "vllm:inter_token_latency_seconds_count{model_name=\"qwen\"} 2.0\n",
           "vllm:inter_token_latency_seconds_bucket{model_name=\"qwen\",le=\"0.01\"} 2.0\n",
           "vllm:time_per_output_token_seconds_count{model_name=\"qwen\"} 2.0\n",
           "vllm:request_time_per_output_token_seconds_sum{model_name=\"qwen\"} 0.1\n",
           "vllm:e2e_request_latency_seconds_bucket{model_name=\"qwen\",le=\"1.5\"} 1.0\n",
           "vllm:num_preemptions_total{model_name=\"qwen\"} 0.0\n",
           "vllm:spec_decode_num_drafts_total{model_name=\"qwen\"} 0.0\n",
           "vllm:spec_decode_num_draft_tokens_total{model_name=\"qwen\"} 0.0\n",
           "vllm:spec_decode_num_accepted_tokens_total{model_name=\"qwen\"} 0.0\n",
           "# TYPE vllm:e2e_request_latency_seconds histogram\n",
       })
    EXPECT_NE(text.find(line), std::string::npos) << line;
}
