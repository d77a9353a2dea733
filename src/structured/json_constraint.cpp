#include "structured/json_constraint.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/error.h"

namespace moeserve::structured {

namespace {

class JsonConstraint : public runtime::TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const TokenMasker> masker, std::optional<int32_t> start_after_token)
      : masker_(std::move(masker)),
        start_after_token_(start_after_token),
        active_(!start_after_token),
        state_(masker_->matcher().start()) {}

  void mask_logits(std::span<float> logits, std::span<const int32_t> end_tokens) override {
    if (!active_) return;
    const bool may_end = masker_->matcher().can_end(state_);
    // The end tokens' logits, to put back where the text may end here.
    saved_.clear();
    if (may_end)
      for (int32_t t : end_tokens)
        if (t >= 0 && size_t(t) < logits.size()) saved_.emplace_back(t, logits[size_t(t)]);
    const std::shared_ptr<const TokenMask> mask = masker_->allowed(state_);
    if (may_end && saved_.empty() && std::all_of(mask->begin(), mask->end(), [](uint64_t w) { return w == 0; }))
      fail("the JSON is complete, but the request has no end-of-sequence or stop token to end it with");
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const size_t n = logits.size();
    for (size_t w = 0; w * 64 < n; ++w) {
      const uint64_t bits = w < mask->size() ? (*mask)[w] : 0;
      const size_t base = w * 64, end = std::min(n, base + 64);
      if (bits == 0) {
        std::fill(logits.begin() + long(base), logits.begin() + long(end), kNegInf);
        continue;
      }
      for (uint64_t refused = ~bits; refused != 0; refused &= refused - 1) {
        const size_t t = base + size_t(__builtin_ctzll(refused));
        if (t < end) logits[t] = kNegInf;
      }
    }
    for (const auto& [t, value] : saved_) logits[size_t(t)] = value;
  }

  void accept(int32_t token, std::span<const int32_t> end_tokens) override {
    if (!active_) {
      if (token == *start_after_token_) active_ = true;
      return;
    }
    const bool is_end = std::find(end_tokens.begin(), end_tokens.end(), token) != end_tokens.end();
    if (is_end && masker_->matcher().can_end(state_)) return;
    const std::string* bytes = masker_->vocab().bytes(token);
    if (bytes == nullptr || !masker_->matcher().feed_all(state_, *bytes))
      fail("token {} does not continue the JSON the response format asks for", token);
  }

 private:
  std::shared_ptr<const TokenMasker> masker_;
  std::optional<int32_t> start_after_token_;
  bool active_;
  MatchState state_;
  std::vector<std::pair<int32_t, float>> saved_;
};

}  // namespace

std::unique_ptr<runtime::TokenConstraint> JsonConstraintFactory::start() const {
  return std::make_unique<JsonConstraint>(masker_, start_after_token_);
}

}  // namespace moeserve::structured
