#include "server/runtime_engine_client.h"

namespace moeserve::server {

uint64_t RuntimeEngineClient::submit(std::vector<int32_t> prompt, const runtime::SamplingParams& params,
                                     runtime::OutputCallback callback) {
  return engine_.submit(std::move(prompt), params, std::move(callback));
}

void RuntimeEngineClient::cancel(uint64_t request_id, runtime::FinishReason why) {
  engine_.cancel(request_id, why);
}

void RuntimeEngineClient::drain() { engine_.drain(); }

EngineSnapshot RuntimeEngineClient::snapshot() const {
  EngineSnapshot s;
  s.stats = engine_.stats();
  return s;
}

}  // namespace moeserve::server
