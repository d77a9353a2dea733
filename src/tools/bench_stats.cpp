#include "tools/bench_stats.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace moeserve::tools {

double mean_of(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / double(values.size());
}

namespace {
double sum_squared_deviation(const std::vector<double>& values) {
  const double m = mean_of(values);
  double ss = 0;
  for (double v : values) ss += (v - m) * (v - m);
  return ss;
}
}  // namespace

double population_std_of(const std::vector<double>& values) {
  if (values.empty()) return 0;
  return std::sqrt(sum_squared_deviation(values) / double(values.size()));
}

double sample_std_of(const std::vector<double>& values) {
  if (values.size() < 2) return 0;
  return std::sqrt(sum_squared_deviation(values) / double(values.size() - 1));
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n % 2 == 1) return values[n / 2];
  return (values[n / 2 - 1] + values[n / 2]) / 2;
}

double percentile_of(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // numpy's default "linear" method: virtual index p/100 * (n-1), interpolated between its
  // neighbours, evaluated from the nearer end as numpy's _lerp does.
  const double index = p / 100.0 * double(values.size() - 1);
  const size_t lo = size_t(std::floor(index));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double t = index - double(lo);
  const double a = values[lo], b = values[hi], diff = b - a;
  return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;
}

LatencyStats summarize_seconds(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  LatencyStats s;
  s.mean_ms = mean_of(seconds) * 1000;
  s.median_ms = median_of(seconds) * 1000;
  s.std_ms = population_std_of(seconds) * 1000;
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, percentile_of(seconds, p) * 1000);
  return s;
}

int64_t effective_output_tokens(const RequestRecord& r) {
  return r.output_tokens > 0 ? r.output_tokens : r.output_chunks;
}

BenchmarkMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                                 const std::vector<double>& percentiles, const GoodputSlo& slo) {
  BenchmarkMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  int64_t good = 0;
  for (const auto& r : records) {
    if (!r.success) {
      ++m.failed;
      m.output_lens.push_back(0);
      continue;
    }
    ++m.completed;
    const int64_t out = effective_output_tokens(r);
    m.output_lens.push_back(out);
    m.total_input += r.prompt_tokens;
    m.total_output += out;
    double tpot = 0;  // a single-token request has no TPOT sample, and counts as 0 for goodput
    if (out > 1) {
      tpot = (r.latency - r.ttft) / double(out - 1);
      tpots.push_back(tpot);
    }
    ttfts.push_back(r.ttft);
    e2els.push_back(r.latency);
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
    const bool meets = (!slo.ttft_ms || r.ttft * 1000 <= *slo.ttft_ms) &&
                       (!slo.tpot_ms || tpot * 1000 <= *slo.tpot_ms) &&
                       (!slo.e2el_ms || r.latency * 1000 <= *slo.e2el_ms);
    if (!slo.empty() && meets) ++good;
  }
  if (duration_s > 0) {
    m.request_throughput = double(m.completed) / duration_s;
    m.request_goodput = double(good) / duration_s;
    m.output_throughput = double(m.total_output) / duration_s;
    m.total_token_throughput = double(m.total_input + m.total_output) / duration_s;
  }
  m.ttft = summarize_seconds(ttfts, percentiles);
  m.tpot = summarize_seconds(tpots, percentiles);
  m.itl = summarize_seconds(itls, percentiles);
  m.e2el = summarize_seconds(e2els, percentiles);

  // Peak output throughput: output chunks per whole second since the earliest request start.
  // Chunk k of a request landed at start + ttft + itl[0] + ... + itl[k-1].
  double t0 = 0, t1 = 0;
  bool any = false;
  for (const auto& r : records) {
    if (!r.success) continue;
    t0 = any ? std::min(t0, r.start_time) : r.start_time;
    t1 = any ? std::max(t1, r.start_time + r.latency) : r.start_time + r.latency;
    any = true;
  }
  if (any) {
    const size_t buckets = size_t(std::ceil(t1 - t0)) + 1;
    std::vector<double> per_second(buckets, 0);
    std::vector<std::pair<double, int>> events;  // (time, +1 start / -1 end)
    for (const auto& r : records) {
      if (!r.success) continue;
      double t = r.start_time + r.ttft;
      auto add = [&](double when) {
        const double offset = when - t0;
        if (offset >= 0 && size_t(offset) < buckets) per_second[size_t(offset)] += 1;
      };
      add(t);
      for (double gap : r.itl) add(t += gap);
      events.emplace_back(r.start_time, +1);
      events.emplace_back(r.start_time + r.latency, -1);
    }
    m.max_output_tokens_per_s = *std::max_element(per_second.begin(), per_second.end());
    // Ends sort before starts at equal times: intervals are half-open.
    std::sort(events.begin(), events.end());
    int64_t live = 0;
    for (const auto& e : events) {
      live += e.second;
      m.max_concurrent_requests = std::max(m.max_concurrent_requests, live);
    }
  }
  return m;
}

namespace {
// The whole of `text` as a finite number, or nullopt.
std::optional<double> parse_number(std::string_view text) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}
}  // namespace

GoodputSlo parse_goodput(const std::vector<std::string>& items) {
  GoodputSlo slo;
  for (const auto& item : items) {
    const auto colon = item.find(':');
    MOESERVE_CHECK(colon != std::string::npos, "--goodput: '{}' is not KEY:MILLISECONDS", item);
    const std::string key = item.substr(0, colon), value = item.substr(colon + 1);
    const auto parsed = parse_number(value);
    MOESERVE_CHECK(parsed, "--goodput: '{}' is not a number of milliseconds in '{}'", value, item);
    const double ms = *parsed;
    MOESERVE_CHECK(ms > 0, "--goodput: the objective in '{}' must be positive", item);
    if (key == "ttft") slo.ttft_ms = ms;
    else if (key == "tpot") slo.tpot_ms = ms;
    else if (key == "e2el") slo.e2el_ms = ms;
    else fail("--goodput: unknown metric '{}' (expected ttft, tpot or e2el)", key);
  }
  return slo;
}

std::vector<double> parse_percentiles(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto parsed = parse_number(item);
    MOESERVE_CHECK(parsed, "--metric-percentiles: '{}' is not a number", item);
    const double p = *parsed;
    MOESERVE_CHECK(p > 0 && p <= 100, "--metric-percentiles: {} is outside (0, 100]", p);
    out.push_back(p);
  }
  return out;
}

}  // namespace moeserve::tools
