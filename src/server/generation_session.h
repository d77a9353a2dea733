// One HTTP generation request in flight: one engine request per choice, one output queue
// they all feed, and the decoders that turn their outputs into text. The HTTP worker calls
// poll() in a loop (with a short timeout, so that it can check in between whether its client
// is still there) until finished(). Destroying a session cancels whatever is still running,
// so a client that goes away frees its KV blocks and state slots in the engine's next step.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "runtime/sampling_params.h"
#include "server/choice_decoder.h"
#include "server/engine_client.h"
#include "server/output_queue.h"
#include "server/server_metrics.h"

namespace moeserve::server {

class SessionRegistry;

struct ChoiceSpec {
  std::vector<int32_t> prompt;
  runtime::SamplingParams sampling;
  ChoiceDecoderOptions decoder;
  int prompt_index = 0;  // completions: which prompt this choice continues
};

class GenerationSession {
 public:
  using Clock = std::chrono::steady_clock;

  GenerationSession(EngineClient& engine, const text::Tokenizer& tokenizer, ServerMetrics& metrics,
                    SessionRegistry& registry, Clock::time_point arrival);
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  // Submits every choice. Throws ApiError: 400 for what the engine rejects, 503 when it is
  // overloaded or draining (choices already submitted are cancelled).
  void start(std::vector<ChoiceSpec> choices);

  struct ChoiceUpdate {
    int choice = 0;
    ChoiceDecoder::Update update;
  };
  // Waits up to `timeout` for outputs and decodes them, in arrival order.
  std::vector<ChoiceUpdate> poll(std::chrono::milliseconds timeout);

  // Every choice has finished (false before start()). Thread-safe.
  bool finished() const { return started_ && finished_choices_ == num_choices_; }
  // Ends every unfinished choice (client gone, shutdown). Safe from any thread.
  void cancel_all(runtime::FinishReason why = runtime::FinishReason::Abort);

  size_t num_choices() const { return decoders_.size(); }
  const ChoiceDecoder& decoder(size_t i) const { return *decoders_[i]; }
  const ChoiceSpec& spec(size_t i) const { return specs_[i]; }

 private:
  struct ChoiceTiming {
    Clock::time_point last_output{};
    Clock::time_point first_token{};
    bool has_first_token = false;
  };
  void observe(size_t choice, const runtime::RequestOutput& output, Clock::time_point now);

  EngineClient& engine_;
  const text::Tokenizer& tokenizer_;
  ServerMetrics& metrics_;
  SessionRegistry& registry_;
  Clock::time_point arrival_;
  std::shared_ptr<OutputQueue> queue_ = std::make_shared<OutputQueue>();

  std::vector<ChoiceSpec> specs_;
  std::vector<std::unique_ptr<ChoiceDecoder>> decoders_;
  std::vector<ChoiceTiming> timing_;
  std::mutex ids_mutex_;
  std::vector<uint64_t> engine_ids_;    // per choice, guarded by ids_mutex_
  std::vector<bool> engine_done_;       // final output seen, guarded by ids_mutex_
  std::atomic<bool> started_{false};
  std::atomic<size_t> num_choices_{0};
  std::atomic<size_t> finished_choices_{0};
};

// Every session in flight, for the in-flight gauge and for aborting what is left when a
// graceful shutdown runs out of time.
class SessionRegistry {
 public:
  void add(GenerationSession* s);
  void remove(GenerationSession* s);
  size_t size() const;
  void cancel_all();
  // Sessions still generating (the in-flight gauge).
  size_t active() const;

 private:
  mutable std::mutex mutex_;
  std::set<GenerationSession*> sessions_;
};

}  // namespace moeserve::server
