#include "tools/bench_report.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve::tools {

using json = nlohmann::json;

namespace {

// One "label   value" line, label padded to 40 columns as in vLLM's report.
void line(std::string& out, const std::string& label, const std::string& value) {
  out += fmt::format("{:<40} {:<10}\n", label, value);
}
std::string num(double v) { return fmt::format("{:.2f}", v); }
// `title` centred in a 50-column rule of `fill` characters (Python's "{:=^50}").
void rule(std::string& out, const std::string& title, char fill) {
  const size_t width = 50, pad = title.size() < width ? width - title.size() : 0;
  out += std::string(pad / 2, fill) + title + std::string(pad - pad / 2, fill) + "\n";
}

void latency_block(std::string& out, const char* title, const char* name, const LatencyStats& s) {
  rule(out, title, '-');
  line(out, fmt::format("Mean {} (ms):", name), num(s.mean_ms));
  line(out, fmt::format("Median {} (ms):", name), num(s.median_ms));
  line(out, fmt::format("Std {} (ms):", name), num(s.std_ms));
  for (const auto& [p, v] : s.percentiles_ms) line(out, fmt::format("P{} {} (ms):", percentile_key(p).substr(1), name), num(v));
}

void latency_json(json& j, const char* key, const LatencyStats& s) {
  j[fmt::format("mean_{}_ms", key)] = s.mean_ms;
  j[fmt::format("median_{}_ms", key)] = s.median_ms;
  j[fmt::format("std_{}_ms", key)] = s.std_ms;
  for (const auto& [p, v] : s.percentiles_ms) j[fmt::format("{}_{}_ms", percentile_key(p), key)] = v;
}

}  // namespace

std::string percentile_key(double p) {
  if (p == std::floor(p)) return fmt::format("p{}", int64_t(p));
  return fmt::format("p{}", p);
}

std::string format_serving_report(const BenchmarkMetrics& m, const ServingRunInfo& info) {
  std::string out;
  rule(out, " Serving Benchmark Result ", '=');
  line(out, "Successful requests:", std::to_string(m.completed));
  line(out, "Failed requests:", std::to_string(m.failed));
  if (info.max_concurrency > 0) line(out, "Maximum request concurrency:", std::to_string(info.max_concurrency));
  line(out, "Request rate configured (RPS):", std::isinf(info.request_rate) ? "inf" : num(info.request_rate));
  line(out, "Benchmark duration (s):", num(m.duration_s));
  line(out, "Total input tokens:", std::to_string(m.total_input));
  line(out, "Total generated tokens:", std::to_string(m.total_output));
  line(out, "Request throughput (req/s):", num(m.request_throughput));
  if (info.goodput) line(out, "Request goodput (req/s):", num(m.request_goodput));
  line(out, "Output token throughput (tok/s):", num(m.output_throughput));
  line(out, "Peak output token throughput (tok/s):", num(m.max_output_tokens_per_s));
  line(out, "Peak concurrent requests:", std::to_string(m.max_concurrent_requests));
  line(out, "Total token throughput (tok/s):", num(m.total_token_throughput));
  latency_block(out, "Time to First Token", "TTFT", m.ttft);
  latency_block(out, "Time per Output Token (excl. 1st token)", "TPOT", m.tpot);
  latency_block(out, "Inter-token Latency", "ITL", m.itl);
  latency_block(out, "End-to-end Latency", "E2EL", m.e2el);
  out += std::string(50, '=') + "\n";
  return out;
}

json serving_result_json(const BenchmarkMetrics& m, const std::vector<RequestRecord>& records,
                         const ServingRunInfo& info) {
  json j;
  j["date"] = now_local_string();
  j["backend"] = "moeserve-bench";
  j["base_url"] = info.base_url;
  j["endpoint"] = info.endpoint;
  j["model_id"] = info.model;
  j["dataset"] = info.dataset;
  j["num_prompts"] = info.num_prompts;
  j["request_rate"] = std::isinf(info.request_rate) ? json("inf") : json(info.request_rate);
  j["burstiness"] = info.burstiness;
  j["max_concurrency"] = info.max_concurrency;
  j["seed"] = info.seed;
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  if (info.goodput) j["request_goodput"] = m.request_goodput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  latency_json(j, "ttft", m.ttft);
  latency_json(j, "tpot", m.tpot);
  latency_json(j, "itl", m.itl);
  latency_json(j, "e2el", m.e2el);
  json input_lens = json::array(), ttfts = json::array(), itls = json::array(), errors = json::array();
  for (const auto& r : records) {
    input_lens.push_back(r.prompt_tokens);
    ttfts.push_back(r.success ? r.ttft : 0.0);
    itls.push_back(r.itl);
    errors.push_back(r.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = m.output_lens;
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["errors"] = std::move(errors);
  return j;
}

void write_json_file(const std::string& path, const json& j) {
  std::ofstream out(path);
  MOESERVE_CHECK(out.good(), "cannot write '{}'", path);
  out << j.dump(2) << "\n";
  out.close();
  MOESERVE_CHECK(out.good(), "error writing '{}'", path);
}

std::string now_local_string() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace moeserve::tools
