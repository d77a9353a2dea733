#include "server/server_metrics.h"

namespace moeserve::server {

using prometheus::Labels;
using runtime::FinishReason;

const std::vector<double>& ServerMetrics::ttft_buckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                        0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                        20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
  return b;
}

const std::vector<double>& ServerMetrics::inter_token_buckets() {
  static const std::vector<double> b = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
                                        0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0,
                                        7.5,  10.0,  20.0, 40.0,  80.0};
  return b;
}

const std::vector<double>& ServerMetrics::e2e_buckets() {
  static const std::vector<double> b = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                        5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return b;
}

ServerMetrics::ServerMetrics(std::string model_name)
    : model_name_(std::move(model_name)),
      ttft_(ttft_buckets()),
      inter_token_(inter_token_buckets()),
      time_per_output_token_(inter_token_buckets()),
      request_time_per_output_token_(inter_token_buckets()),
      e2e_(e2e_buckets()) {}

void ServerMetrics::observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }

void ServerMetrics::observe_inter_token(double seconds, int tokens) {
  if (tokens <= 0) return;
  // Several tokens in one output (speculative decoding) share the interval evenly.
  const double per_token = seconds / tokens;
  for (int i = 0; i < tokens; ++i) {
    inter_token_.observe(per_token);
    time_per_output_token_.observe(per_token);
  }
}

void ServerMetrics::observe_request_finished(FinishReason reason, double e2e_seconds,
                                             double decode_seconds, int generated_tokens) {
  e2e_.observe(e2e_seconds);
  if (generated_tokens > 1)
    request_time_per_output_token_.observe(decode_seconds / (generated_tokens - 1));
  switch (reason) {
    case FinishReason::Stop: success_[0].add(); break;
    case FinishReason::Length: success_[1].add(); break;
    default: success_[2].add(); break;
  }
}

std::string ServerMetrics::render(const EngineSnapshot& engine, int http_in_flight) const {
  const Labels model = {{"model_name", model_name_}};
  const auto& s = engine.stats;
  prometheus::TextWriter w;

  w.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
  w.sample("vllm:num_requests_running", model, s.running);
  w.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  w.sample("vllm:num_requests_waiting", model, s.waiting);
  w.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  w.sample("vllm:kv_cache_usage_perc", model, s.kv_usage);

  w.family("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.");
  w.sample("vllm:num_preemptions_total", model, double(s.num_preemptions));
  w.family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
  w.sample("vllm:prompt_tokens_total", model, double(s.prompt_tokens_total));
  w.family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.");
  w.sample("vllm:generation_tokens_total", model, double(s.generation_tokens_total));

  w.family("vllm:request_success_total", "counter", "Count of successfully processed requests.");
  const char* reasons[] = {"stop", "length", "abort"};
  for (size_t i = 0; i < success_.size(); ++i) {
    Labels l = model;
    l.emplace_back("finished_reason", reasons[i]);
    w.sample("vllm:request_success_total", l, success_[i].value());
  }

  w.family("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.");
  w.sample("vllm:spec_decode_num_drafts_total", model, double(engine.spec_num_drafts));
  w.family("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.");
  w.sample("vllm:spec_decode_num_draft_tokens_total", model, double(engine.spec_num_draft_tokens));
  w.family("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.");
  w.sample("vllm:spec_decode_num_accepted_tokens_total", model,
           double(engine.spec_num_accepted_tokens));

  w.family("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.");
  w.histogram("vllm:time_to_first_token_seconds", model, ttft_.snapshot());
  w.family("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.");
  w.histogram("vllm:inter_token_latency_seconds", model, inter_token_.snapshot());
  w.family("vllm:time_per_output_token_seconds", "histogram",
           "Histogram of time per output token in seconds (deprecated alias of inter_token_latency_seconds).");
  w.histogram("vllm:time_per_output_token_seconds", model, time_per_output_token_.snapshot());
  w.family("vllm:request_time_per_output_token_seconds", "histogram",
           "Histogram of time_per_output_token_seconds per request.");
  w.histogram("vllm:request_time_per_output_token_seconds", model,
              request_time_per_output_token_.snapshot());
  w.family("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.");
  w.histogram("vllm:e2e_request_latency_seconds", model, e2e_.snapshot());

  // moeserve's own: cache occupancy in absolute units (tests check that every block and
  // slot comes back), and the server's view of open requests.
  w.family("moeserve:kv_blocks_free", "gauge", "Free KV-cache blocks.");
  w.sample("moeserve:kv_blocks_free", model, s.free_kv_blocks);
  w.family("moeserve:kv_blocks_total", "gauge", "KV-cache blocks in the pool.");
  w.sample("moeserve:kv_blocks_total", model, s.total_kv_blocks);
  w.family("moeserve:state_slots_free", "gauge", "Free GDN state slots.");
  w.sample("moeserve:state_slots_free", model, s.free_state_slots);
  w.family("moeserve:state_slots_total", "gauge", "GDN state slots in the pool.");
  w.sample("moeserve:state_slots_total", model, s.total_state_slots);
  w.family("moeserve:engine_steps_total", "counter", "Engine steps run.");
  w.sample("moeserve:engine_steps_total", model, double(s.num_steps));
  w.family("moeserve:http_requests_in_flight", "gauge", "Generation requests the HTTP server holds open.");
  w.sample("moeserve:http_requests_in_flight", model, http_in_flight);
  w.family("moeserve:ready", "gauge", "1 once the model is loaded and the server accepts requests.");
  w.sample("moeserve:ready", model, ready_.load() ? 1.0 : 0.0);
  return w.text();
}

}  // namespace moeserve::server
