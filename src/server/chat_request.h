// POST /v1/chat/completions: the request body, validated. Messages are normalised into the
// shape Hugging Face chat templates read (content as a string, assistant tool-call
// arguments as objects, reasoning as `reasoning_content`), the way vLLM prepares them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/sampling_request.h"

namespace moeserve::server {

enum class ToolChoice { None, Auto, Required, Named };

// Server settings that decide which tool choices are allowed.
struct ToolSettings {
  bool enable_auto_tool_choice = false;  // --enable-auto-tool-choice
  std::string tool_call_parser;          // --tool-call-parser ("" if none)
};

struct ChatRequest {
  std::string model;
  nlohmann::json messages = nlohmann::json::array();  // normalised, for the template
  nlohmann::json tools;                               // null or the request's array
  ToolChoice tool_choice = ToolChoice::None;
  std::string named_tool;                             // ToolChoice::Named
  bool parallel_tool_calls = true;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();  // defaults + request
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  GenerationOptions generation;
};

// Throws ApiError (400 bad field, 404 unknown model).
ChatRequest parse_chat_request(const nlohmann::json& body, const std::vector<std::string>& served_names,
                               const RequestLimits& limits, const ToolSettings& tools,
                               const nlohmann::json& default_chat_template_kwargs,
                               const SamplingDefaults& sampling_defaults = {});

}  // namespace moeserve::server
