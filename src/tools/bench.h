// `moeserve bench`: a benchmark client for any OpenAI-compatible server.
//   - load mode (default): random or dataset prompts, streamed, at a request rate and a
//     concurrency limit; reports TTFT, TPOT, ITL, E2EL and throughputs like `vllm bench serve`;
//   - --suite spark5: the reference project's 5-prompt end-to-end tok/s harness.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace moeserve::tools {

struct BenchOptions {
  // Server
  std::string base_url = "http://127.0.0.1:8000";
  std::string api_key;
  std::string model;                 // empty: the first of GET /v1/models
  std::string endpoint = "chat";     // chat | completions
  double timeout_s = 600;
  // Suite mode
  std::string suite;                 // "" (load mode) or "spark5"
  int64_t runs = 1;                  // spark5: measured passes after the warm-up
  bool no_warmup = false;
  // Load mode
  int64_t num_prompts = 1000;
  int64_t concurrency = 0;           // 0: no limit (one worker per request, capped)
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  uint64_t seed = 0;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;
  bool random_ids = false;           // completions: random token-id prompts
  std::string dataset;               // JSONL file; overrides the random prompts
  double temperature = 0.0;
  bool ignore_eos = false;
  std::string extra_body;            // JSON object merged into every request body
  std::string percentiles = "90,99";
  std::vector<std::string> goodput;  // "ttft:MS", "tpot:MS", "e2el:MS"
  int64_t warmup_requests = 1;       // unmeasured requests first (also checks the endpoint)
  std::string output_json;           // result file
  bool no_progress = false;        // no progress bar
};

// The most worker threads (open connections) load mode starts when --concurrency is 0.
inline constexpr int64_t kMaxUnlimitedConcurrency = 1024;

// Runs the benchmark, prints the report to stdout (progress and per-request lines to
// stderr), writes --output-json. Returns the exit code: 0 when at least one request
// succeeded. Throws moeserve::Error for bad options or an unreachable server.
int run_bench(const BenchOptions& o);

}  // namespace moeserve::tools
