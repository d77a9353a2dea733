// The tokens a request has seen, in the form the penalties need: the distinct tokens of
// prompt + output (repetition penalty) and the count of each output token (presence and
// frequency penalties). Kept incrementally so a step costs O(distinct tokens), not O(vocab).
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace moeserve::runtime {

class TokenHistory {
 public:
  void set_prompt(std::span<const int32_t> prompt) {
    for (int32_t t : prompt) note_seen(t);
  }
  void add_output(int32_t token) {
    ++output_counts_[token];
    note_seen(token);
  }

  // Distinct tokens of prompt + output, in first-seen order.
  const std::vector<int32_t>& seen() const { return seen_order_; }
  const std::unordered_map<int32_t, int>& output_counts() const { return output_counts_; }

 private:
  void note_seen(int32_t t) {
    if (seen_.insert(t).second) seen_order_.push_back(t);
  }
  std::unordered_set<int32_t> seen_;
  std::vector<int32_t> seen_order_;
  std::unordered_map<int32_t, int> output_counts_;
};

}  // namespace moeserve::runtime
