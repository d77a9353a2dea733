#include "server/stop_matcher.h"

#include <algorithm>

namespace moeserve::server {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopStringMatcher::Result StopStringMatcher::feed(std::string_view piece) {
  Result result;
  if (stopped_) return result;
  if (stops_.empty()) {
    result.text.assign(piece);
    return result;
  }
  std::string buffer = std::move(pending_);
  pending_.clear();
  buffer.append(piece);

  // Earliest occurrence of any stop string; on a tie, the longest string wins.
  size_t best_pos = std::string::npos;
  const std::string* best = nullptr;
  for (const auto& stop : stops_) {
    const size_t pos = buffer.find(stop);
    if (pos == std::string::npos) continue;
    if (pos < best_pos || (pos == best_pos && stop.size() > best->size())) {
      best_pos = pos;
      best = &stop;
    }
  }
  if (best) {
    stopped_ = true;
    result.text = buffer.substr(0, include_stop_ ? best_pos + best->size() : best_pos);
    result.stopped = *best;
    return result;
  }

  // Hold back the longest suffix of `buffer` that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& stop : stops_) {
    const size_t max_k = std::min(buffer.size(), stop.size() - 1);
    for (size_t k = max_k; k > hold; --k) {
      if (std::string_view(buffer).substr(buffer.size() - k) == std::string_view(stop).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  pending_ = buffer.substr(buffer.size() - hold);
  buffer.resize(buffer.size() - hold);
  result.text = std::move(buffer);
  return result;
}

std::string StopStringMatcher::flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace moeserve::server
