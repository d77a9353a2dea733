// Serving-benchmark metrics, defined as `vllm bench serve` defines them
// (vllm/benchmarks/serve.py, calculate_metrics; ../shared/spec/peers.md section 2.3), so our
// numbers and vLLM's can be put side by side:
//   TTFT  time from sending the request to the first streamed output chunk;
//   ITL   the gaps between consecutive output chunks (one entry per chunk after the first;
//         a chunk may hold several tokens, e.g. with speculative decoding);
//   E2EL  time from sending the request to the last streamed data event (client side);
//   TPOT  (E2EL - TTFT) / (output_tokens - 1), for requests with more than one output token;
//   throughputs divide by the benchmark's wall time: completed requests, output tokens, and
//   input + output tokens;
//   peak output throughput: the most output chunks that landed in one whole second of the
//   run; peak concurrency: the most requests in flight at once (half-open [start, end)).
// Statistics follow numpy: the mean, the population standard deviation (ddof=0), the median,
// and percentiles with linear interpolation; an empty sample gives 0 for all of them.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::tools {

// What one benchmark request produced. Times are in seconds.
struct RequestRecord {
  bool success = false;
  std::string error;              // why it failed (HTTP status and body, transport error, ...)
  int http_status = 0;
  double start_time = 0;          // when it was sent, seconds since the benchmark started
  double ttft = 0;
  double latency = 0;             // E2EL
  std::vector<double> itl;
  int64_t prompt_tokens = 0;      // usage.prompt_tokens, else the prompt's planned length
  int64_t output_tokens = 0;      // usage.completion_tokens; 0 when the server sent no usage
  int64_t output_chunks = 0;      // streamed chunks that carried output
  std::string generated_text;     // content + reasoning, concatenated
};

struct LatencyStats {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

// Service-level objectives for goodput (`--goodput ttft:MS tpot:MS e2el:MS`): a completed
// request is "good" when it meets every objective given.
struct GoodputSlo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};

struct BenchmarkMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  double duration_s = 0;
  double request_throughput = 0, request_goodput = 0;
  double output_throughput = 0, total_token_throughput = 0;
  double max_output_tokens_per_s = 0;
  int64_t max_concurrent_requests = 0;
  LatencyStats ttft, tpot, itl, e2el;
  std::vector<int64_t> output_lens;  // per request; 0 for failed ones
};

// numpy.mean / numpy.std (ddof=0) / numpy.median / numpy.percentile (linear) of `values`;
// 0 for an empty sample. `p` is in [0, 100].
double mean_of(const std::vector<double>& values);
double population_std_of(const std::vector<double>& values);
double sample_std_of(const std::vector<double>& values);  // ddof=1; 0 for fewer than 2 values
double median_of(std::vector<double> values);
double percentile_of(std::vector<double> values, double p);

LatencyStats summarize_seconds(const std::vector<double>& seconds, const std::vector<double>& percentiles);

// The output token count used for throughput and TPOT: usage.completion_tokens when the
// server reported it, else the number of output chunks (vLLM re-tokenizes the text instead;
// a client without the model's tokenizer can only count chunks).
int64_t effective_output_tokens(const RequestRecord& r);

BenchmarkMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                                 const std::vector<double>& percentiles, const GoodputSlo& slo = {});

// Parses "ttft:500 tpot:50" (milliseconds; keys ttft, tpot, e2el). Throws moeserve::Error.
GoodputSlo parse_goodput(const std::vector<std::string>& items);
// Parses "50,90,99" into percentiles in (0, 100]. Throws moeserve::Error.
std::vector<double> parse_percentiles(const std::string& text);

}  // namespace moeserve::tools
