// The /metrics page, with vLLM's metric names so that dashboards and `vllm bench serve`
// work unchanged (vLLM docs/usage/metrics.md). Latency histograms are observed here, by the
// server, as outputs reach it; gauges and token counters come from the engine's stats at
// scrape time. Every series carries model_name="<served model name>".
#pragma once
#include <array>
#include <atomic>
#include <string>

#include "runtime/engine.h"
#include "server/prometheus.h"

namespace moeserve::server {

// Engine-side numbers at scrape time (runtime::Engine::Stats plus counters the engine does
// not keep yet: speculative decoding).
struct EngineSnapshot {
  runtime::Engine::Stats stats;
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
};

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name);

  // Time from arrival to the first generated token of a request.
  void observe_time_to_first_token(double seconds);
  // Time between two consecutive outputs of a request, per token they carry.
  void observe_inter_token(double seconds, int tokens);
  // One finished request: e2e latency, and decode time per output token after the first.
  void observe_request_finished(runtime::FinishReason reason, double e2e_seconds,
                                double decode_seconds, int generated_tokens);
  void set_ready(bool ready) { ready_ = ready; }

  // `http_in_flight`: generation requests the server holds open now.
  std::string render(const EngineSnapshot& engine, int http_in_flight = 0) const;

  // vLLM's bucket boundaries.
  static const std::vector<double>& ttft_buckets();
  static const std::vector<double>& inter_token_buckets();
  static const std::vector<double>& e2e_buckets();

 private:
  std::string model_name_;
  prometheus::Histogram ttft_;
  prometheus::Histogram inter_token_;
  prometheus::Histogram time_per_output_token_;          // deprecated alias of the above
  prometheus::Histogram request_time_per_output_token_;  // per request
  prometheus::Histogram e2e_;
  std::array<prometheus::Counter, 3> success_;  // stop, length, abort
  std::atomic<bool> ready_{false};
};

}  // namespace moeserve::server
