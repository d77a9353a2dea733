// The load benchmark's engine: sends prepared requests from a pool of worker threads (one
// HTTP connection each), at most `concurrency` in flight, each no earlier than its arrival
// time, and records what every request did.
#pragma once
#include <cstdint>
#include <vector>

#include "tools/bench_client.h"
#include "tools/progress_bar.h"

namespace moeserve::tools {

struct LoadRunResult {
  std::vector<RequestRecord> records;  // in request order
  double duration_s = 0;               // from the start to the last completion
};

// `arrivals[i]` is request i's earliest send time in seconds from the start (see
// make_arrival_times). Requests are taken in order; a request whose time has come waits for a
// free worker, as vLLM's --max-concurrency semaphore does. `progress` may be null.
LoadRunResult run_load(const ClientOptions& client, const SamplingSettings& sampling,
                       const std::vector<GenerationRequest>& requests, const std::vector<double>& arrivals,
                       int64_t concurrency, ProgressBar* progress);

}  // namespace moeserve::tools
