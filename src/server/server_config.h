// The OpenAI server's settings (from `moeserve serve` flags) and the model-side pieces it
// serves with once the model has loaded.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/engine_client.h"
#include "server/sampling_request.h"
#include "text/tokenizer.h"

namespace moeserve::server {

struct ServerConfig {
  std::vector<std::string> served_model_names;  // the first is the default and the metrics label
  std::string model_root;                       // MODEL_DIR as given (/v1/models "root")
  std::string reasoning_parser;                 // --reasoning-parser ("" none)
  std::string tool_call_parser;                 // --tool-call-parser ("" none)
  bool enable_auto_tool_choice = false;
  nlohmann::json default_chat_template_kwargs = nlohmann::json::object();
  RequestLimits limits;
  SamplingDefaults sampling_defaults;  // from generation_config.json (--generation-config auto)
  std::vector<std::string> api_keys;
  // --structured-outputs-config (vLLM's keys): JSON without whitespace between its tokens;
  // the grammar also during a thinking model's reasoning.
  struct StructuredOutputsConfig {
    bool disable_any_whitespace = false;
    bool enable_in_reasoning = false;
  } structured_outputs;
  // How often a waiting worker checks that its client is still connected.
  std::chrono::milliseconds disconnect_poll{50};
  // Graceful shutdown: requests still running after this long are aborted.
  std::chrono::seconds shutdown_timeout{30};
};

// Renders a chat for generation: the normalised messages, tools (null if none), and the
// template flags and kwargs. Throws moeserve::Error with the template's message when it
// rejects the chat (the server answers 400).
struct ChatPromptRequest {
  const nlohmann::json& messages;
  const nlohmann::json& tools;
  bool add_generation_prompt;
  bool continue_final_message;
  const nlohmann::json& kwargs;
};
using ChatRenderer = std::function<std::string(const ChatPromptRequest&)>;

// What exists once the model is loaded. Everything must outlive the server.
struct ModelServices {
  const text::Tokenizer* tokenizer = nullptr;
  ChatRenderer render_chat;
  EngineClient* engine = nullptr;
  std::unordered_set<int32_t> eos_token_ids;  // end a choice with stop_reason null
  // Added to every request's stop_token_ids unless ignore_eos: eos ids the engine does not
  // stop at by itself (generation_config.json's, the tokenizer's eos token).
  std::vector<int32_t> extra_stop_token_ids;
};

// Adds the model's extra stop tokens to a request (vLLM: unless ignore_eos).
inline void add_model_stop_tokens(runtime::SamplingParams& params, const ModelServices& services) {
  if (params.ignore_eos) return;
  for (int32_t id : services.extra_stop_token_ids)
    if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), id) == params.stop_token_ids.end())
      params.stop_token_ids.push_back(id);
}

}  // namespace moeserve::server
