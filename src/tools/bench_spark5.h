// The "spark5" suite: the 5-prompt end-to-end harness behind the DGX Spark Qwen3.5-122B
// numbers (51.58 tok/s), reproduced exactly so our numbers sit next to the reference's
// (../shared/spec/reference_project.md section 1.4).
//
// Source: albond/DGX_Spark_Qwen3.5-122B-A10B-AR-INT4, bench_qwen35.sh (commit a320a3e):
// five prompts with max_tokens 256/512/1024/64/2048, each sent as one user message to
// POST /v1/chat/completions, non-streaming, temperature 0.0, nothing else in the body;
// tok/s = usage.completion_tokens / wall time of the whole request (prefill, HTTP and
// detokenisation included). Every pass runs the five prompts in order; pass 1 is a warm-up
// and is discarded. The reference's v2.4 table averages 10 measured passes per prompt
// (mean/median/std per prompt), then reports the mean over the five prompts.
// Differences: the reference times `curl` with `date +%s%N` and rounds the elapsed time to
// 10 ms before dividing; we time the request with a monotonic clock, unrounded. It opens a
// new connection per request (curl); so do we.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench_client.h"

namespace moeserve::tools {

struct Spark5Prompt {
  const char* name;
  const char* text;
  int64_t max_tokens;
};
// The five prompts, verbatim from bench_qwen35.sh (prompt texts are data).
const std::vector<Spark5Prompt>& spark5_prompts();

struct Spark5Options {
  ClientOptions client;
  std::string model;               // empty: the first of GET /v1/models
  int64_t runs = 1;                // measured passes after the warm-up pass
  bool warmup = true;
  nlohmann::json extra_body;       // merged into each body (default: nothing, as the reference)
};

// One request of the suite.
struct Spark5Sample {
  int pass = 0;                    // 0 = warm-up
  std::string prompt;              // the prompt's name
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double elapsed_s = 0;
  double tok_per_s = 0;
};

struct Spark5PromptSummary {
  std::string name;
  int64_t max_tokens = 0;
  int64_t n = 0;                   // successful measured samples
  double mean = 0, median = 0, std = 0;  // tok/s; std is the sample std (n-1)
  double mean_prompt_tokens = 0, mean_completion_tokens = 0;
};

struct Spark5Result {
  std::string model;
  std::vector<Spark5Sample> samples;
  std::vector<Spark5PromptSummary> prompts;
  double cross_prompt_mean = 0;    // mean of the per-prompt means (prompts with samples)
  int64_t failures = 0;            // failed measured requests
  // From /metrics counter deltas when the server exports vLLM's spec-decode counters.
  bool has_acceptance = false;
  double mean_acceptance_length = 0;  // 1 + accepted / drafts
};

// Summaries from samples (measured passes only). Pure, for tests.
void summarize_spark5(Spark5Result& result);

// Runs the suite, printing one line per request to `log` (null: silent).
Spark5Result run_spark5(const Spark5Options& o, std::FILE* log);

std::string format_spark5_report(const Spark5Result& r);
nlohmann::json spark5_result_json(const Spark5Result& r, const Spark5Options& o);

// Sums vLLM's spec-decode counters ("vllm:spec_decode_num_drafts_total" and
// "vllm:spec_decode_num_accepted_tokens_total", over all label sets) in a Prometheus text
// exposition. Returns false when neither is present.
bool parse_spec_decode_counters(const std::string& metrics_text, double& drafts, double& accepted);

}  // namespace moeserve::tools
