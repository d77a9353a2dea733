#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace moeserve::runtime {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Most likely first; among equals the lower id, so every order is deterministic.
struct ByValueDesc {
  const float* values;
  bool operator()(int32_t a, int32_t b) const {
    if (values[a] != values[b]) return values[a] > values[b];
    return a < b;
  }
};

float sanitize(float x) { return std::isnan(x) ? kNegInf : x; }

}  // namespace

// A weighted quickselect: partition around the median, keep the half that holds the cut.
size_t top_p_cut(std::vector<int32_t>& cand, const float* keys, const float* w, double target) {
  ByValueDesc order{keys};
  size_t lo = 0, hi = cand.size();  // the cut lies in (lo, hi]; [0, lo) is kept, weighing `kept`
  double kept = 0.0;
  while (hi - lo > 64) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(cand.begin() + ptrdiff_t(lo), cand.begin() + ptrdiff_t(mid), cand.begin() + ptrdiff_t(hi), order);
    double upper = 0.0;  // weight of [lo, mid]
    for (size_t i = lo; i <= mid; ++i) upper += w[cand[i]];
    if (kept + upper >= target) {
      hi = mid + 1;
    } else {
      kept += upper;
      lo = mid + 1;
    }
  }
  std::sort(cand.begin() + ptrdiff_t(lo), cand.begin() + ptrdiff_t(hi), order);
  for (size_t i = lo; i < hi; ++i) {
    kept += w[cand[i]];
    if (kept >= target) return i + 1;
  }
  return hi;  // rounding left the target a hair out of reach: keep the range
}

size_t top_p_cut(std::vector<int32_t>& cand, const float* w, double target) { return top_p_cut(cand, w, w, target); }

float inverse_temperature(double temperature) { return float(1.0 / temperature); }

float min_p_log_ratio(double min_p) {
  // Below e^-87 of the most likely token's weight a token is never drawn: its weight would
  // no longer be a normal float, and a sum of 2^18 of them is under 1e-30 of the total.
  constexpr float kFloor = -87.0f;
  if (!(min_p > 0.0)) return kFloor;
  return std::max(float(std::log(min_p)), kFloor);
}

TokenLogprob compute_logprobs(std::span<const float> logits, int32_t token, int top_k) {
  const int64_t vocab = int64_t(logits.size());
  MOESERVE_CHECK(token >= 0 && token < vocab, "logprobs: token {} outside the vocabulary of {}", token, vocab);
  float max_logit = kNegInf;
  for (float x : logits) max_logit = std::max(max_logit, sanitize(x));
  double sum = 0.0;
  if (max_logit != kNegInf) {
    for (float x : logits) {
      const float v = sanitize(x);
      if (v != kNegInf) sum += std::exp(double(v) - double(max_logit));
    }
  }
  // log-sum-exp; with every logit -inf every logprob is -inf.
  const double lse = max_logit == kNegInf ? std::numeric_limits<double>::infinity()
                                          : double(max_logit) + std::log(sum);
  auto logprob_of = [&](int32_t t) {
    const float v = sanitize(logits[size_t(t)]);
    return v == kNegInf ? kNegInf : float(double(v) - lse);
  };

  TokenLogprob out;
  out.token = token;
  out.logprob = logprob_of(token);
  if (top_k > 0) {
    const int k = int(std::min<int64_t>(top_k, vocab));
    // One pass keeping the k best in a small sorted buffer: O(vocab * k) worst case but
    // O(vocab) in practice, and no vocab-sized scratch.
    std::vector<int32_t> best;
    best.reserve(size_t(k) + 1);
    auto better = [&](int32_t a, int32_t b) {
      const float va = sanitize(logits[size_t(a)]), vb = sanitize(logits[size_t(b)]);
      if (va != vb) return va > vb;
      return a < b;
    };
    for (int32_t t = 0; t < vocab; ++t) {
      if (int(best.size()) == k && !better(t, best.back())) continue;
      auto pos = std::upper_bound(best.begin(), best.end(), t, better);
      best.insert(pos, t);
      if (int(best.size()) > k) best.pop_back();
    }
    out.top.reserve(best.size());
    for (int32_t t : best) out.top.emplace_back(t, logprob_of(t));
  }
  return out;
}

bool Sampler::needs_processing(const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const bool min_tokens_active =
      in.num_generated < p.min_tokens && (!p.stop_token_ids.empty() || (!p.ignore_eos && !in.eos_token_ids.empty()));
  const bool penalties = in.history != nullptr && (p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 ||
                                                   p.presence_penalty != 0.0);
  return min_tokens_active || in.constraint != nullptr || !p.logit_bias.empty() || penalties;
}

const std::vector<float>& Sampler::process_logits(const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const auto vocab = int64_t(in.logits.size());
  work_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) work_[size_t(i)] = sanitize(in.logits[size_t(i)]);
  auto in_vocab = [&](int64_t t) { return t >= 0 && t < vocab; };

  // min_tokens: nothing may stop the request early.
  if (in.num_generated < p.min_tokens) {
    for (int32_t t : p.stop_token_ids)
      if (in_vocab(t)) work_[size_t(t)] = kNegInf;
    if (!p.ignore_eos)
      for (int64_t t : in.eos_token_ids)
        if (in_vocab(t)) work_[size_t(t)] = kNegInf;
  }
  if (in.constraint) in.constraint->mask_logits(work_, end_tokens(in));
  for (const auto& [token, bias] : p.logit_bias)
    if (in_vocab(token)) work_[size_t(token)] += bias;

  if (p.repetition_penalty != 1.0 && in.history) {
    const auto penalty = float(p.repetition_penalty);
    for (int32_t t : in.history->seen()) {
      if (!in_vocab(t)) continue;
      float& x = work_[size_t(t)];
      x = x > 0 ? x / penalty : x * penalty;
    }
  }
  if ((p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) && in.history) {
    for (const auto& [t, count] : in.history->output_counts()) {
      if (!in_vocab(t)) continue;
      work_[size_t(t)] -= float(p.frequency_penalty) * float(count) + float(p.presence_penalty);
    }
  }
  return work_;
}

int32_t Sampler::argmax_of_work() const {
  int32_t best = -1;
  float best_value = kNegInf;
  for (size_t t = 0; t < work_.size(); ++t) {
    if (work_[t] > best_value) {  // strict: the lowest id wins ties; NaN never wins
      best_value = work_[t];
      best = int32_t(t);
    }
  }
  if (best < 0) fail("sampling: every token is masked");
  return best;
}

int32_t Sampler::sample_random(const model::DeviceSampleParams& p, Rng* rng) {
  const auto vocab = int32_t(work_.size());
  // Separate passes: the scaled logits are rounded to fp32 before anything else reads them
  // (no fused multiply-add), as on the device.
  float max_scaled = kNegInf;
  for (float& x : work_) {
    x *= p.inv_temperature;
    max_scaled = std::max(max_scaled, x);
  }
  weights_.resize(work_.size());
  candidates_.clear();
  for (int32_t t = 0; t < vocab; ++t) {
    const float d = work_[size_t(t)] - max_scaled;  // NaN when the max is -inf or +inf: no candidate
    if (d >= p.min_log_ratio) {
      candidates_.push_back(t);
      weights_[size_t(t)] = std::exp(d);
    }
  }
  if (candidates_.empty()) fail("sampling: every token is masked");
  ByValueDesc order{work_.data()};

  // candidates_ stays in id order, the order of the draw; the rankings work on a copy.
  if (p.top_k > 0 && size_t(p.top_k) < candidates_.size()) {
    // Like vLLM, tokens tied with the k-th most likely one stay in.
    ranked_ = candidates_;
    std::nth_element(ranked_.begin(), ranked_.begin() + (p.top_k - 1), ranked_.end(), order);
    const float kth = work_[size_t(ranked_[size_t(p.top_k - 1)])];
    std::erase_if(candidates_, [&](int32_t t) { return work_[size_t(t)] < kth; });
  }
  if (p.top_p < 1.0) {
    double total = 0.0;
    for (int32_t t : candidates_) total += weights_[size_t(t)];
    ranked_ = candidates_;
    const size_t cut = top_p_cut(ranked_, work_.data(), weights_.data(), p.top_p * total);
    const int32_t last = ranked_[cut - 1];  // the lowest-ranked token kept
    std::erase_if(candidates_, [&](int32_t t) { return order(last, t); });
  }

  double total = 0.0;
  for (int32_t t : candidates_) total += weights_[size_t(t)];
  const double u = (rng ? rng->uniform() : p.uniform) * total;
  double cumulative = 0.0;
  for (int32_t t : candidates_) {
    cumulative += weights_[size_t(t)];
    if (u < cumulative) return t;
  }
  return candidates_.back();  // u rounded up to the total
}

SampleResult Sampler::sample(const SampleInput& in) {
  MOESERVE_CHECK(in.params != nullptr && in.rng != nullptr, "Sampler::sample: missing params or RNG");
  MOESERVE_CHECK(!in.logits.empty(), "Sampler::sample: empty logits");
  SampleResult result;
  const SamplingParams& p = *in.params;
  if (p.greedy()) {
    // Without processing, greedy reads the raw logits in place (no vocab-sized copy).
    const std::span<const float> logits = needs_processing(in) ? std::span<const float>(process_logits(in)) : in.logits;
    int32_t best = -1;
    float best_value = kNegInf;
    for (size_t t = 0; t < logits.size(); ++t) {
      if (logits[t] > best_value) {  // strict: the lowest id wins ties; NaN never wins
        best_value = logits[t];
        best = int32_t(t);
      }
    }
    if (best < 0) fail("sampling: every token is masked");
    result.token = best;
  } else {
    process_logits(in);
    model::DeviceSampleParams draw;
    draw.greedy = false;
    draw.inv_temperature = inverse_temperature(p.temperature);
    draw.min_log_ratio = min_p_log_ratio(p.min_p);
    draw.top_k = p.top_k;
    draw.top_p = p.top_p;
    result.token = sample_random(draw, in.rng);
  }
  if (in.params->logprobs >= 0) result.logprob = compute_logprobs(in.logits, result.token, in.params->logprobs);
  return result;
}

}  // namespace moeserve::runtime

namespace moeserve::runtime {

SampleResult Sampler::sample_row(std::span<const float> logits, const model::DeviceSampleParams& p) {
  MOESERVE_CHECK(!logits.empty(), "Sampler::sample_row: empty logits");
  const auto vocab = int64_t(logits.size());
  work_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) work_[i] = sanitize(logits[i]);
  for (int32_t t : p.masked_tokens)
    if (t >= 0 && t < vocab) work_[size_t(t)] = kNegInf;
  SampleResult result;
  result.token = p.greedy ? argmax_of_work() : sample_random(p, nullptr);
  if (p.num_logprobs >= 0) result.logprob = compute_logprobs(logits, result.token, p.num_logprobs);
  return result;
}

std::vector<int32_t> end_tokens(const SampleInput& in) {
  std::vector<int32_t> ends(in.params->stop_token_ids);
  if (!in.params->ignore_eos)
    for (int64_t t : in.eos_token_ids) ends.push_back(int32_t(t));
  return ends;
}

std::optional<model::DeviceSampleParams> to_device_sample(const SampleInput& in, int64_t vocab,
                                                          std::vector<int32_t>& masked) {
  MOESERVE_CHECK(in.params != nullptr && in.rng != nullptr, "to_device_sample: missing params or RNG");
  const SamplingParams& p = *in.params;
  const bool penalties = in.history != nullptr && (p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 ||
                                                   p.presence_penalty != 0.0);
  if (penalties || !p.logit_bias.empty() || p.constraint || p.logprobs > model::kMaxDeviceLogprobs)
    return std::nullopt;
  masked.clear();
  if (in.num_generated < p.min_tokens) {  // as process_logits: stop tokens, and eos unless ignored
    for (int32_t t : p.stop_token_ids)
      if (t >= 0 && t < vocab) masked.push_back(t);
    if (!p.ignore_eos)
      for (int64_t t : in.eos_token_ids)
        if (t >= 0 && t < vocab) masked.push_back(int32_t(t));
    std::sort(masked.begin(), masked.end());
    masked.erase(std::unique(masked.begin(), masked.end()), masked.end());
    if (masked.size() > size_t(model::kMaxDeviceMaskedTokens)) return std::nullopt;
  }
  model::DeviceSampleParams d;
  d.greedy = p.greedy();
  d.num_logprobs = p.logprobs;
  d.masked_tokens = masked;
  if (!d.greedy) {
    d.inv_temperature = inverse_temperature(p.temperature);
    d.min_log_ratio = min_p_log_ratio(p.min_p);
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    d.uniform = in.rng->uniform();
  }
  return d;
}

}  // namespace moeserve::runtime
