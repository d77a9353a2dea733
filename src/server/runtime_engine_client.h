// EngineClient over the real runtime::Engine.
#pragma once
#include "runtime/engine.h"
#include "server/engine_client.h"

namespace moeserve::server {

class RuntimeEngineClient final : public EngineClient {
 public:
  explicit RuntimeEngineClient(runtime::Engine& engine) : engine_(engine) {}
  uint64_t submit(std::vector<int32_t> prompt, const runtime::SamplingParams& params,
                  runtime::OutputCallback callback) override;
  void cancel(uint64_t request_id, runtime::FinishReason why) override;
  void drain() override;
  EngineSnapshot snapshot() const override;

 private:
  runtime::Engine& engine_;
};

}  // namespace moeserve::server
