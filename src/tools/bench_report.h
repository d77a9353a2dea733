// Text and JSON reports of a load benchmark, laid out like `vllm bench serve`'s (same line
// labels, same JSON keys), so results from either tool can be compared line by line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench_stats.h"

namespace moeserve::tools {

// What was run, echoed in the report.
struct ServingRunInfo {
  std::string base_url, model, endpoint, dataset;
  int64_t num_prompts = 0;
  int64_t max_concurrency = 0;
  double request_rate = 0;     // inf: all at once
  double burstiness = 1;
  uint64_t seed = 0;
  bool goodput = false;        // whether --goodput was given
};

std::string format_serving_report(const BenchmarkMetrics& m, const ServingRunInfo& info);

// The result file (--output-json): configuration, aggregate metrics and per-request arrays
// (input_lens, output_lens, ttfts, itls, errors), with vLLM's key names.
nlohmann::json serving_result_json(const BenchmarkMetrics& m, const std::vector<RequestRecord>& records,
                                   const ServingRunInfo& info);

// "p99" / "p99.9": vLLM's percentile key spelling.
std::string percentile_key(double p);

// Writes `j` (indented) to `path`; throws moeserve::Error naming the file.
void write_json_file(const std::string& path, const nlohmann::json& j);

// Local time as "2026-11-30 14:05:09".
std::string now_local_string();

}  // namespace moeserve::tools
