#include "server/generation_session.h"

#include <fmt/format.h>

#include "core/log.h"
#include "server/api_error.h"

namespace moeserve::server {

using runtime::FinishReason;

GenerationSession::GenerationSession(EngineClient& engine, const text::Tokenizer& tokenizer,
                                     ServerMetrics& metrics, SessionRegistry& registry,
                                     Clock::time_point arrival)
    : engine_(engine), tokenizer_(tokenizer), metrics_(metrics), registry_(registry), arrival_(arrival) {
  registry_.add(this);
}

GenerationSession::~GenerationSession() {
  cancel_all(FinishReason::Abort);
  // Choices that never saw their final output (the client left): counted as aborted.
  const auto now = Clock::now();
  for (size_t i = 0; i < decoders_.size(); ++i) {
    if (decoders_[i]->finished() || i >= engine_done_.size() || engine_done_[i]) continue;
    const auto& t = timing_[i];
    metrics_.observe_request_finished(
        FinishReason::Abort, std::chrono::duration<double>(now - arrival_).count(),
        t.has_first_token ? std::chrono::duration<double>(now - t.first_token).count() : 0.0,
        decoders_[i]->completion_tokens());
  }
  registry_.remove(this);
}

void GenerationSession::start(std::vector<ChoiceSpec> choices) {
  specs_ = std::move(choices);
  for (auto& spec : specs_) decoders_.push_back(std::make_unique<ChoiceDecoder>(tokenizer_, spec.decoder));
  timing_.assign(specs_.size(), ChoiceTiming{});
  {
    std::lock_guard lock(ids_mutex_);
    engine_ids_.assign(specs_.size(), 0);
    engine_done_.assign(specs_.size(), true);  // nothing to cancel until submitted
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    // The callback runs on the engine thread: push and return. The queue outlives the
    // session if the engine still holds the callback.
    auto queue = queue_;
    uint64_t id = 0;
    try {
      id = engine_.submit(specs_[i].prompt, specs_[i].sampling,
                          [queue](const runtime::RequestOutput& out) { queue->push(out); });
    } catch (const runtime::EngineOverloaded& e) {
      cancel_all();
      throw ApiError(503, fmt::format("The server is overloaded or shutting down: {}", e.what()));
    } catch (const ApiError&) {
      cancel_all();
      throw;
    } catch (const Error& e) {
      cancel_all();
      throw ApiError(400, e.what());
    }
    std::lock_guard lock(ids_mutex_);
    engine_ids_[i] = id;
    engine_done_[i] = false;
    timing_[i].last_output = arrival_;
  }
  num_choices_ = specs_.size();
  started_ = true;
}

void GenerationSession::observe(size_t choice, const runtime::RequestOutput& output,
                                Clock::time_point now) {
  auto& t = timing_[choice];
  const int tokens = int(output.new_tokens.size());
  if (tokens > 0) {
    if (!t.has_first_token) {
      t.has_first_token = true;
      t.first_token = now;
      metrics_.observe_time_to_first_token(std::chrono::duration<double>(now - arrival_).count());
      if (tokens > 1)
        metrics_.observe_inter_token(0.0, tokens - 1);
    } else {
      metrics_.observe_inter_token(std::chrono::duration<double>(now - t.last_output).count(), tokens);
    }
    t.last_output = now;
  }
}

std::vector<GenerationSession::ChoiceUpdate> GenerationSession::poll(std::chrono::milliseconds timeout) {
  std::vector<ChoiceUpdate> updates;
  if (finished()) return updates;
  auto outputs = queue_->pop_all(timeout);
  const auto now = Clock::now();
  for (const auto& out : outputs) {
    size_t choice = specs_.size();
    {
      std::lock_guard lock(ids_mutex_);
      for (size_t i = 0; i < engine_ids_.size(); ++i)
        if (engine_ids_[i] == out.request_id) choice = i;
      if (choice == specs_.size()) continue;  // not ours (cannot happen)
      if (out.finish != FinishReason::None) engine_done_[choice] = true;
    }
    auto& decoder = *decoders_[choice];
    if (decoder.finished()) continue;  // outputs after a stop string
    observe(choice, out, now);
    ChoiceUpdate u{int(choice), decoder.consume(out)};
    if (decoder.finished()) {
      ++finished_choices_;
      const auto& t = timing_[choice];
      const double e2e = std::chrono::duration<double>(now - arrival_).count();
      const double decode = t.has_first_token ? std::chrono::duration<double>(now - t.first_token).count() : 0.0;
      const FinishReason reason = decoder.hit_stop_string() ? FinishReason::Stop : out.finish;
      metrics_.observe_request_finished(reason, e2e, decode, decoder.completion_tokens());
      if (!out.error.empty())
        log::warn("request {} failed in the engine: {}", out.request_id, out.error);
      if (decoder.hit_stop_string() && out.finish == FinishReason::None) {
        // A stop string ended the choice before the engine did: free its resources now.
        engine_.cancel(out.request_id, FinishReason::Stop);
      }
    }
    if (!u.update.empty()) updates.push_back(std::move(u));
  }
  return updates;
}

void GenerationSession::cancel_all(FinishReason why) {
  std::lock_guard lock(ids_mutex_);
  for (size_t i = 0; i < engine_ids_.size(); ++i)
    if (!engine_done_[i]) engine_.cancel(engine_ids_[i], why);
}

void SessionRegistry::add(GenerationSession* s) {
  std::lock_guard lock(mutex_);
  sessions_.insert(s);
}

void SessionRegistry::remove(GenerationSession* s) {
  std::lock_guard lock(mutex_);
  sessions_.erase(s);
}

size_t SessionRegistry::size() const {
  std::lock_guard lock(mutex_);
  return sessions_.size();
}

size_t SessionRegistry::active() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto* s : sessions_) n += !s->finished();
  return n;
}

void SessionRegistry::cancel_all() {
  std::lock_guard lock(mutex_);
  for (auto* s : sessions_) s->cancel_all(FinishReason::Abort);
}

}  // namespace moeserve::server
