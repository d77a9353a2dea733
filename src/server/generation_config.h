// A model's generation_config.json, as `vllm serve --generation-config auto` reads it: extra
// eos ids (generation stops at them too) and default sampling values for requests that set
// none (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens).
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/sampling_request.h"

namespace moeserve::server {

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;
  SamplingDefaults defaults;
};

// From parsed JSON; `source` names the file in errors. Values out of range are errors.
GenerationConfig parse_generation_config(const nlohmann::json& j, const std::string& source);
// <dir>/generation_config.json; an empty config when the file does not exist.
GenerationConfig load_generation_config(const std::filesystem::path& dir);

}  // namespace moeserve::server
