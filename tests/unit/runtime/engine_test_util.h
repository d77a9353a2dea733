// Helpers for the engine tests: an output recorder per request and the reference a request's
// tokens must match (the request alone, sampled straight from the HashModel's reference logits).
#pragma once
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "hash_model.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace moeserve::runtime::testing {

class Recorder : public std::enable_shared_from_this<Recorder> {
 public:
  static std::shared_ptr<Recorder> create() { return std::make_shared<Recorder>(); }

  OutputCallback callback() {
    auto self = shared_from_this();
    return [self](const RequestOutput& out) { self->on_output(out); };
  }

  void on_output(const RequestOutput& out) {
    std::lock_guard lock(mutex_);
    if (done_) ++outputs_after_final_;
    outputs_.push_back(out);
    tokens_.insert(tokens_.end(), out.new_tokens.begin(), out.new_tokens.end());
    if (out.finish != FinishReason::None) done_ = true;
    cv_.notify_all();
  }

  // Waits for the final output; false on timeout.
  bool wait(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
  }
  // Waits until at least n tokens arrived (or the request ended).
  bool wait_tokens(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return done_ || tokens_.size() >= n; });
  }

  bool done() const {
    std::lock_guard lock(mutex_);
    return done_;
  }
  std::vector<int32_t> tokens() const {
    std::lock_guard lock(mutex_);
    return tokens_;
  }
  std::vector<RequestOutput> outputs() const {
    std::lock_guard lock(mutex_);
    return outputs_;
  }
  RequestOutput last() const {
    std::lock_guard lock(mutex_);
    return outputs_.empty() ? RequestOutput{} : outputs_.back();
  }
  int outputs_after_final() const {
    std::lock_guard lock(mutex_);
    return outputs_after_final_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<RequestOutput> outputs_;
  std::vector<int32_t> tokens_;
  bool done_ = false;
  int outputs_after_final_ = 0;
};

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::None;
  std::optional<int32_t> stop_token;
};

// What a request must produce: its own loop over the reference logits, with the request's
// seed (so seeded sampling is checked too, not only greedy).
inline Reference reference_run(const std::vector<int32_t>& prompt, const SamplingParams& params, int64_t vocab,
                               const std::vector<int64_t>& eos, int max_model_len) {
  Reference ref;
  Sampler sampler;
  Rng rng(params.seed.value_or(0));
  TokenHistory history;
  history.set_prompt(prompt);
  std::vector<int32_t> all = prompt;
  while (true) {
    const std::vector<float> logits = reference_logits(all, vocab);
    SampleInput in;
    in.logits = logits;
    in.params = &params;
    in.history = &history;
    in.num_generated = int(ref.tokens.size());
    in.eos_token_ids = eos;
    in.rng = &rng;
    SampleResult r = sampler.sample(in);
    ref.tokens.push_back(r.token);
    if (r.logprob) ref.logprobs.push_back(*r.logprob);
    all.push_back(r.token);
    history.add_output(r.token);
    const bool may_stop = int(ref.tokens.size()) - 1 >= params.min_tokens;
    const bool is_eos = !params.ignore_eos && std::find(eos.begin(), eos.end(), int64_t(r.token)) != eos.end();
    const bool is_stop =
        std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), r.token) != params.stop_token_ids.end();
    if (may_stop && (is_eos || is_stop)) {
      ref.finish = FinishReason::Stop;
      ref.stop_token = r.token;
      return ref;
    }
    if (int(ref.tokens.size()) >= params.max_tokens || int(all.size()) >= max_model_len) {
      ref.finish = FinishReason::Length;
      return ref;
    }
  }
}

}  // namespace moeserve::runtime::testing
