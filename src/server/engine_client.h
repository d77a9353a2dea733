// What the HTTP server needs from an engine: submit, cancel, drain, stats. runtime::Engine is
// the implementation (runtime_engine_client.h); server unit tests drive the HTTP layer with a
// scripted fake that replays canned token streams.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/engine.h"
#include "server/server_metrics.h"

namespace moeserve::server {

class EngineClient {
 public:
  virtual ~EngineClient() = default;
  // As runtime::Engine::submit: throws moeserve::Error for a bad request (HTTP 400) or
  // runtime::EngineOverloaded when it cannot be queued (HTTP 503).
  virtual uint64_t submit(std::vector<int32_t> prompt, const runtime::SamplingParams& params,
                          runtime::OutputCallback callback) = 0;
  virtual void cancel(uint64_t request_id, runtime::FinishReason why) = 0;
  virtual void drain() = 0;
  virtual EngineSnapshot snapshot() const = 0;
};

}  // namespace moeserve::server
