#include "server/prometheus.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace moeserve::server::prometheus {

void Counter::add(double v) {
  std::lock_guard lock(mutex_);
  value_ += v;
}

double Counter::value() const {
  std::lock_guard lock(mutex_);
  return value_;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::observe(double v) {
  // Bucket i counts observations <= bounds_[i] ("le" semantics).
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  std::lock_guard lock(mutex_);
  counts_[i] += 1;
  sum_ += v;
  count_ += 1;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  std::lock_guard lock(mutex_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integral values print with ".0" the way prometheus_client does.
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);
}

namespace {
std::string render_labels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ",";
    out += labels[i].first;
    out += "=\"";
    out += escape_label_value(labels[i].second);
    out += "\"";
  }
  out += "}";
  return out;
}
}  // namespace

void TextWriter::family(const std::string& name, const std::string& type,
                        const std::string& help) {
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void TextWriter::sample(const std::string& name, const Labels& labels, double value) {
  out_ += name;
  out_ += render_labels(labels);
  out_ += ' ';
  out_ += format_value(value);
  out_ += '\n';
}

void TextWriter::histogram(const std::string& name, const Labels& labels,
                           const Histogram::Snapshot& s) {
  for (size_t i = 0; i <= s.upper_bounds.size(); ++i) {
    Labels with_le = labels;
    with_le.emplace_back("le", i < s.upper_bounds.size() ? format_value(s.upper_bounds[i]) : "+Inf");
    sample(name + "_bucket", with_le, double(s.cumulative[i]));
  }
  sample(name + "_count", labels, double(s.count));
  sample(name + "_sum", labels, s.sum);
}

}  // namespace moeserve::server::prometheus
