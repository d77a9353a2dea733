#include "tools/bench_load.h"

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "core/error.h"

namespace moeserve::tools {

using Clock = std::chrono::steady_clock;

LoadRunResult run_load(const ClientOptions& client, const SamplingSettings& sampling,
                       const std::vector<GenerationRequest>& requests, const std::vector<double>& arrivals,
                       int64_t concurrency, ProgressBar* progress) {
  MOESERVE_CHECK(arrivals.size() == requests.size(), "run_load: {} arrival times for {} requests",
                 arrivals.size(), requests.size());
  MOESERVE_CHECK(concurrency > 0, "--concurrency must be positive, got {}", concurrency);
  LoadRunResult result;
  result.records.resize(requests.size());
  const int64_t workers = std::min<int64_t>(concurrency, int64_t(requests.size()));
  std::atomic<size_t> next{0};

  // One client (one connection) per worker: httplib clients are not shared across threads.
  // Made here, so that a bad URL fails in the caller rather than inside a thread.
  std::vector<std::unique_ptr<BenchClient>> clients;
  for (int64_t w = 0; w < workers; ++w) clients.push_back(std::make_unique<BenchClient>(client));

  const auto start = Clock::now();
  auto worker = [&](BenchClient& http) {
    for (size_t i = next++; i < requests.size(); i = next++) {
      const auto due = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i]));
      std::this_thread::sleep_until(due);
      result.records[i] = http.stream_generation(requests[i], sampling, start);
      if (progress) progress->advance();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(size_t(workers));
  for (auto& c : clients) threads.emplace_back(worker, std::ref(*c));
  for (auto& t : threads) t.join();
  result.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (progress) progress->finish();
  return result;
}

}  // namespace moeserve::tools
