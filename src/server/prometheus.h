// Minimal Prometheus text exposition (format 0.0.4): thread-safe counters and histograms,
// and a writer that renders families with HELP/TYPE lines and escaped label values.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::server::prometheus {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void add(double v = 1.0);
  double value() const;

 private:
  mutable std::mutex mutex_;
  double value_ = 0.0;
};

class Histogram {
 public:
  // `upper_bounds` ascending; a +Inf bucket is implicit.
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf last
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // non-cumulative, size bounds+1
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// Renders the text format into a string.
class TextWriter {
 public:
  void family(const std::string& name, const std::string& type, const std::string& help);
  void sample(const std::string& name, const Labels& labels, double value);
  void histogram(const std::string& name, const Labels& labels, const Histogram::Snapshot& s);
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

std::string escape_label_value(const std::string& value);
std::string format_value(double v);

}  // namespace moeserve::server::prometheus
