// POST /v1/completions: the request body, validated. `prompt` may be a string, a list of
// strings, a list of token ids, or a list of token-id lists; each prompt yields `n` choices
// (choice index = prompt index * n + i, as OpenAI and vLLM number them).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/sampling_request.h"

namespace moeserve::server {

struct CompletionPrompt {
  std::optional<std::string> text;  // a text prompt (tokenized by the server)
  std::vector<int32_t> token_ids;   // a token prompt (or filled in after tokenizing)
};

struct CompletionRequest {
  std::string model;
  std::vector<CompletionPrompt> prompts;
  bool add_special_tokens = true;
  GenerationOptions generation;
};

CompletionRequest parse_completion_request(const nlohmann::json& body,
                                           const std::vector<std::string>& served_names,
                                           const RequestLimits& limits,
                                           const SamplingDefaults& sampling_defaults = {});

}  // namespace moeserve::server
