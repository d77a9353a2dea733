// A scripted stand-in for runtime::Engine, for testing the HTTP layer without a model: each
// submitted request replays the tokens a script gives for its prompt, one per step, on an
// engine thread, with the real engine's finish rules (eos / stop tokens -> Stop unless
// ignore_eos, max_tokens -> Length, cancel -> a final output with the given reason). It
// records cancels and counts live requests, so tests can check that nothing leaks.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"
#include "server/engine_client.h"

namespace moeserve::server::testing {

class FakeEngine final : public EngineClient {
 public:
  using Script = std::function<std::vector<int32_t>(const std::vector<int32_t>& prompt,
                                                    const runtime::SamplingParams& params)>;

  FakeEngine(Script script, std::set<int32_t> eos_ids, std::chrono::microseconds step = std::chrono::microseconds(500))
      : script_(std::move(script)), eos_ids_(std::move(eos_ids)), step_(step) {
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  uint64_t submit(std::vector<int32_t> prompt, const runtime::SamplingParams& params,
                  runtime::OutputCallback callback) override {
    if (prompt.empty()) fail("prompt is empty");
    if (overloaded_) throw runtime::EngineOverloaded("queue full");
    Request r;
    r.prompt = std::move(prompt);
    r.params = params;
    r.callback = std::move(callback);
    r.script = script_(r.prompt, params);
    std::lock_guard lock(mutex_);
    params_log_.push_back(params);
    const uint64_t id = next_id_++;
    r.id = id;
    requests_.emplace(id, std::move(r));
    ++submitted_;
    wake_.notify_all();
    if (on_submit_) on_submit_();
    return id;
  }

  // Runs inside submit(), i.e. on the HTTP worker in the middle of the request's handler.
  void set_on_submit(std::function<void()> hook) { on_submit_ = std::move(hook); }

  void cancel(uint64_t id, runtime::FinishReason why) override {
    std::lock_guard lock(mutex_);
    cancels_.emplace_back(id, why);
    pending_cancels_.emplace_back(id, why);
  }

  void drain() override {}

  EngineSnapshot snapshot() const override {
    std::lock_guard lock(mutex_);
    EngineSnapshot s;
    s.stats.running = int(requests_.size());
    s.stats.total_kv_blocks = 64;
    s.stats.free_kv_blocks = 64 - int(requests_.size());
    s.stats.total_state_slots = 8;
    s.stats.free_state_slots = 8 - int(std::min<size_t>(8, requests_.size()));
    return s;
  }

  size_t live_requests() const {
    std::lock_guard lock(mutex_);
    return requests_.size();
  }
  size_t submitted() const {
    std::lock_guard lock(mutex_);
    return submitted_;
  }
  std::vector<std::pair<uint64_t, runtime::FinishReason>> cancels() const {
    std::lock_guard lock(mutex_);
    return cancels_;
  }
  std::vector<runtime::SamplingParams> submitted_params() const {
    std::lock_guard lock(mutex_);
    return params_log_;
  }
  void set_overloaded(bool v) { overloaded_ = v; }
  void set_step(std::chrono::microseconds step) { step_ = step; }

  // Deterministic logprobs the tests can predict.
  static float logprob_of(int position) { return -0.25f * float(position + 1); }

 private:
  struct Request {
    uint64_t id = 0;
    std::vector<int32_t> prompt;
    runtime::SamplingParams params;
    runtime::OutputCallback callback;
    std::vector<int32_t> script;
    size_t generated = 0;
    bool sent_prompt_logprobs = false;
  };

  void loop() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, step_.load(), [&] { return stop_ || !requests_.empty() || !pending_cancels_.empty(); });
      if (stop_) break;
      std::vector<std::pair<runtime::OutputCallback, runtime::RequestOutput>> outputs;
      for (auto& [id, why] : pending_cancels_) {
        auto it = requests_.find(id);
        if (it == requests_.end()) continue;
        runtime::RequestOutput out;
        out.request_id = id;
        out.finish = why;
        out.num_prompt_tokens = int(it->second.prompt.size());
        out.num_generated_tokens = int(it->second.generated);
        outputs.emplace_back(it->second.callback, out);
        requests_.erase(it);
      }
      pending_cancels_.clear();
      for (auto it = requests_.begin(); it != requests_.end();) {
        Request& r = it->second;
        runtime::RequestOutput out;
        out.request_id = r.id;
        out.num_prompt_tokens = int(r.prompt.size());
        if (!r.sent_prompt_logprobs && r.params.prompt_logprobs >= 0) {
          out.prompt_logprobs.push_back(std::nullopt);
          for (size_t i = 1; i < r.prompt.size(); ++i)
            out.prompt_logprobs.push_back(runtime::TokenLogprob{r.prompt[i], -1.0f, {{r.prompt[i], -1.0f}}});
        }
        r.sent_prompt_logprobs = true;
        // Past the script: keep producing its last token (a model that never stops).
        const int32_t token = r.generated < r.script.size() ? r.script[r.generated]
                                                           : (r.script.empty() ? 0 : r.script.back());
        out.new_tokens.push_back(token);
        if (r.params.logprobs >= 0) {
          runtime::TokenLogprob lp{token, logprob_of(int(r.generated)), {}};
          for (int k = 0; k < r.params.logprobs; ++k) lp.top.emplace_back(token + k, logprob_of(int(r.generated)) - float(k));
          out.logprobs.push_back(lp);
        }
        ++r.generated;
        out.num_generated_tokens = int(r.generated);
        const bool is_stop = (!r.params.ignore_eos && eos_ids_.count(token)) ||
                             std::find(r.params.stop_token_ids.begin(), r.params.stop_token_ids.end(), token) !=
                                 r.params.stop_token_ids.end();
        if (is_stop && int(r.generated) >= r.params.min_tokens) {
          out.finish = runtime::FinishReason::Stop;
          out.stop_token = token;
        } else if (int(r.generated) >= r.params.max_tokens) {
          out.finish = runtime::FinishReason::Length;
        }
        outputs.emplace_back(r.callback, out);
        if (out.finish != runtime::FinishReason::None) it = requests_.erase(it);
        else ++it;
      }
      lock.unlock();
      for (auto& [callback, out] : outputs) callback(out);
      std::this_thread::sleep_for(step_.load());
      lock.lock();
    }
    // Shutdown: like ~Engine, whatever still runs ends with Abort.
    for (auto& [id, r] : requests_) {
      runtime::RequestOutput out;
      out.request_id = id;
      out.finish = runtime::FinishReason::Abort;
      r.callback(out);
    }
  }

  Script script_;
  std::set<int32_t> eos_ids_;
  std::atomic<std::chrono::microseconds> step_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Request> requests_;
  std::vector<std::pair<uint64_t, runtime::FinishReason>> cancels_, pending_cancels_;
  std::vector<runtime::SamplingParams> params_log_;
  uint64_t next_id_ = 1;
  size_t submitted_ = 0;
  std::atomic<bool> overloaded_{false};
  std::function<void()> on_submit_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moeserve::server::testing
