#include "tools/bench.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "tools/bench_dataset.h"
#include "tools/bench_load.h"
#include "tools/bench_report.h"
#include "tools/bench_spark5.h"
#include "tools/progress_bar.h"

namespace moeserve::tools {

using json = nlohmann::json;

namespace {

json parse_extra_body(const std::string& text) {
  if (text.empty()) return json();
  auto j = json::parse(text, nullptr, false);
  MOESERVE_CHECK(!j.is_discarded() && j.is_object(), "--extra-body must be a JSON object, got '{}'", text);
  return j;
}

int run_suite(const BenchOptions& o, const ClientOptions& client) {
  MOESERVE_CHECK(o.suite == "spark5", "unknown --suite '{}' (available: spark5)", o.suite);
  MOESERVE_CHECK(o.endpoint == "chat", "--suite spark5 uses the chat endpoint only");
  Spark5Options so;
  so.client = client;
  so.model = o.model;
  so.runs = o.runs;
  so.warmup = !o.no_warmup;
  so.extra_body = parse_extra_body(o.extra_body);
  Spark5Result r = run_spark5(so, stderr);
  std::fputs(format_spark5_report(r).c_str(), stdout);
  if (!o.output_json.empty()) write_json_file(o.output_json, spark5_result_json(r, so));
  int64_t ok = 0;
  for (const auto& p : r.prompts) ok += p.n;
  return ok > 0 ? 0 : 1;
}

std::vector<GenerationRequest> make_prompts(const BenchOptions& o, ApiEndpoint endpoint) {
  if (!o.dataset.empty()) return load_jsonl_prompts(o.dataset, o.num_prompts, o.output_len, endpoint);
  MOESERVE_CHECK(!o.random_ids || endpoint == ApiEndpoint::Completions,
                 "--random-ids sends token-id prompts, which only --endpoint completions accepts");
  RandomPromptOptions r;
  r.num_prompts = o.num_prompts;
  r.input_len = o.input_len;
  r.output_len = o.output_len;
  r.range_ratio = o.range_ratio;
  r.seed = o.seed;
  r.token_ids = o.random_ids;
  return make_random_prompts(r);
}

int run_load_mode(const BenchOptions& o, const ClientOptions& client) {
  SamplingSettings sampling;
  sampling.endpoint = parse_api_endpoint(o.endpoint);
  sampling.temperature = o.temperature;
  sampling.ignore_eos = o.ignore_eos;
  sampling.extra_body = parse_extra_body(o.extra_body);
  const std::vector<double> percentiles = parse_percentiles(o.percentiles);
  const GoodputSlo slo = parse_goodput(o.goodput);
  MOESERVE_CHECK(o.concurrency >= 0, "--concurrency must be positive (or 0 for no limit), got {}", o.concurrency);
  MOESERVE_CHECK(o.warmup_requests >= 0, "--warmup-requests must not be negative");

  BenchClient probe(client);
  sampling.model = o.model.empty() ? probe.first_model_id() : o.model;
  const auto requests = make_prompts(o, sampling.endpoint);
  const auto arrivals = make_arrival_times(int64_t(requests.size()), o.request_rate, o.burstiness, o.seed);

  for (int64_t i = 0; i < o.warmup_requests; ++i) {
    const RequestRecord w =
        probe.stream_generation(requests[size_t(i) % requests.size()], sampling, std::chrono::steady_clock::now());
    MOESERVE_CHECK(w.success, "the warm-up request to {}{} failed: {}", o.base_url, api_path(sampling.endpoint),
                   w.error);
  }

  const int64_t concurrency =
      o.concurrency > 0 ? o.concurrency : std::min<int64_t>(int64_t(requests.size()), kMaxUnlimitedConcurrency);
  const std::string rate = std::isinf(o.request_rate) ? "inf" : fmt::format("{:.2f}", o.request_rate);
  const std::string limit = o.concurrency > 0 ? std::to_string(o.concurrency) : "unlimited";
  std::fprintf(stderr, "model %s, %zu requests, request rate %s, burstiness %.2f, concurrency %s\n",
               sampling.model.c_str(), requests.size(), rate.c_str(), o.burstiness, limit.c_str());
  ProgressBar bar("requests", int64_t(requests.size()), stderr,
                  o.no_progress ? ProgressBar::Mode::Off : ProgressBar::Mode::Auto, "req");
  const LoadRunResult run = run_load(client, sampling, requests, arrivals, concurrency, &bar);

  const BenchmarkMetrics m = compute_metrics(run.records, run.duration_s, percentiles, slo);
  ServingRunInfo info;
  info.base_url = o.base_url;
  info.model = sampling.model;
  info.endpoint = api_path(sampling.endpoint);
  info.dataset = o.dataset.empty() ? fmt::format("random(input_len={}, output_len={}, range_ratio={}{})", o.input_len,
                                                 o.output_len, o.range_ratio, o.random_ids ? ", token ids" : "")
                                   : o.dataset;
  info.num_prompts = int64_t(requests.size());
  info.max_concurrency = o.concurrency;
  info.request_rate = o.request_rate;
  info.burstiness = o.burstiness;
  info.seed = o.seed;
  info.goodput = !slo.empty();
  int shown = 0;
  for (const auto& r : run.records) {
    if (r.success || shown >= 10) continue;
    if (shown++ == 0) std::fprintf(stderr, "failed requests (first 10):\n");
    std::fprintf(stderr, "  %s\n", r.error.c_str());
  }
  std::fputs(format_serving_report(m, info).c_str(), stdout);
  std::fflush(stdout);
  if (!o.output_json.empty()) write_json_file(o.output_json, serving_result_json(m, run.records, info));
  return m.completed > 0 ? 0 : 1;
}

}  // namespace

int run_bench(const BenchOptions& o) {
  ClientOptions client;
  client.base = parse_base_url(o.base_url);
  client.api_key = o.api_key;
  MOESERVE_CHECK(o.timeout_s > 0, "--timeout must be positive, got {}", o.timeout_s);
  client.timeout_s = o.timeout_s;
  if (!o.suite.empty()) return run_suite(o, client);
  return run_load_mode(o, client);
}

}  // namespace moeserve::tools
