// The engine: owns a model, runs the step loop on its own thread, and serves requests
// submitted from any thread.
//
// Each step the scheduler (scheduler.h) picks a batch: the decode token of every running
// sequence first, then prefill chunks of partially prefilled and newly admitted requests,
// under max_num_batched_tokens and max_num_seqs. The model runs it, the sampler picks the
// next token of every sequence whose chunk reached its end, and outputs go to the callbacks.
// KV blocks (block_manager.h) and GDN state slots (state_slots.h) are the engine's to hand
// out; when blocks run out the newest running sequence is preempted (its blocks and slot are
// freed and it later re-prefills prompt + generated tokens). docs/RUNTIME.md has the details.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "io/qwen35_config.h"
#include "model/causal_lm.h"
#include "runtime/engine_config.h"
#include "runtime/request_output.h"
#include "runtime/sampling_params.h"

namespace moeserve::runtime {

// submit() refused a valid request because the waiting queue is full, or because the engine
// is draining or stopped (the server answers 503 rather than 400).
class EngineOverloaded : public Error {
 public:
  using Error::Error;
};

class Engine {
 public:
  // Plans the cache memory, allocates the model's caches, and starts the engine thread.
  // Throws moeserve::Error if the configuration is invalid or one max_model_len sequence
  // cannot fit in the budget.
  Engine(std::unique_ptr<model::CausalLM> model, EngineConfig config);
  // Stops the engine thread; requests still running get a final output with Abort.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Validates the request (prompt non-empty, token ids < vocab, prompt +
  // max_tokens <= max_model_len, sampling parameters in range) and throws moeserve::Error with
  // a user-facing message when it is bad (the server maps it to HTTP 400), or
  // EngineOverloaded when it cannot be queued. Returns the request id. The callback receives
  // every output of this request, the last one with finish != None.
  uint64_t submit(std::vector<int32_t> prompt, SamplingParams params, OutputCallback callback);

  // Thread-safe. Ends a request: its KV blocks and state slot are freed before the next
  // forward, and a final output with `why` (and no new tokens) is delivered. Unknown or
  // finished ids are ignored.
  void cancel(uint64_t request_id, FinishReason why = FinishReason::Abort);

  // Thread-safe. Stops admitting new requests (submit throws EngineOverloaded) and blocks
  // until every request already submitted has finished (for SIGTERM).
  void drain();

  struct Stats {
    int running = 0;                 // sequences holding a state slot
    int waiting = 0;                 // submitted, not running (new or preempted)
    double kv_usage = 0.0;           // fraction of KV blocks in use, 0..1
    int64_t num_preemptions = 0;
    int64_t prompt_tokens_total = 0;      // prompt tokens of admitted requests
    int64_t generation_tokens_total = 0;  // tokens generated
    int64_t requests_finished_total = 0;  // every request that got its final output
    int64_t num_steps = 0;
    int free_kv_blocks = 0, total_kv_blocks = 0;
    int free_state_slots = 0, total_state_slots = 0;
    int kv_block_size = 0;
  };
  // Thread-safe; a snapshot taken at the end of the latest step.
  Stats stats() const;

  const io::Qwen35Config& model_config() const;
  const EngineConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::runtime
