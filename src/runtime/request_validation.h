// Checks a request before it is queued. Messages are written for the API user (the server
// returns them as HTTP 400 bodies).
#pragma once
#include <cstdint>
#include <span>

#include "runtime/engine_config.h"
#include "runtime/sampling_params.h"

namespace moeserve::runtime {

// Throws moeserve::Error naming the offending field when the prompt or a parameter is invalid.
void validate_request(std::span<const int32_t> prompt, const SamplingParams& params, int64_t vocab_size,
                      const EngineConfig& config);

}  // namespace moeserve::runtime
