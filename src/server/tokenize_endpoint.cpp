// POST /tokenize and POST /detokenize, in vLLM's shapes:
//   /tokenize   {"prompt": "...", "add_special_tokens": true, "return_token_strs": false}
//            or {"messages": [...], "add_generation_prompt": true, "continue_final_message",
//                "add_special_tokens": false, "chat_template_kwargs": {...}, "tools": [...]}
//            -> {"count", "max_model_len", "tokens", "token_strs"}
//   /detokenize {"tokens": [...]} -> {"prompt": "..."}
#include <fmt/format.h>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/json_fields.h"
#include "server/openai_server.h"

namespace moeserve::server {

using nlohmann::json;

void OpenAiServer::handle_tokenize(const httplib::Request& req, httplib::Response& res) const {
  const ModelServices& svc = services();
  const json body = parse_body(req);
  JsonFields f(body);
  resolve_model(f, config_.served_model_names);

  std::string text;
  bool add_special_tokens;
  if (f.has("messages")) {
    // Reuse the chat parser for the messages, tools and template options; sampling fields
    // are not part of a tokenize request and are ignored.
    json chat = json::object();
    for (const char* key : {"model", "messages", "tools", "chat_template_kwargs",
                            "add_generation_prompt", "continue_final_message"})
      if (body.contains(key)) chat[key] = body[key];
    if (chat.contains("tools")) chat["tool_choice"] = "none";
    const ChatRequest r = parse_chat_request(chat, config_.served_model_names, config_.limits,
                                             ToolSettings{config_.enable_auto_tool_choice, config_.tool_call_parser},
                                             config_.default_chat_template_kwargs);
    if (!svc.render_chat) throw ApiError(400, "This model has no chat template.", "messages");
    try {
      text = svc.render_chat(ChatPromptRequest{r.messages, r.tools, r.add_generation_prompt,
                                               r.continue_final_message, r.chat_template_kwargs});
    } catch (const ApiError&) {
      throw;
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("The chat template rejected the request: {}", e.what()), "messages");
    }
    add_special_tokens = f.boolean("add_special_tokens").value_or(false);
  } else {
    text = f.required_string("prompt");
    add_special_tokens = f.boolean("add_special_tokens").value_or(true);
  }
  const bool return_token_strs = f.boolean("return_token_strs").value_or(false);

  std::vector<int32_t> tokens;
  try {
    tokens = svc.tokenizer->encode(text, add_special_tokens);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("Cannot tokenize: {}", e.what()), "prompt");
  }
  json out = {{"count", tokens.size()}, {"max_model_len", config_.limits.max_model_len}, {"tokens", tokens}};
  if (return_token_strs) {
    json strs = json::array();
    for (int32_t id : tokens) strs.push_back(svc.tokenizer->id_to_token(id));
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  send_json(res, out);
}

void OpenAiServer::handle_detokenize(const httplib::Request& req, httplib::Response& res) const {
  const ModelServices& svc = services();
  const json body = parse_body(req);
  JsonFields f(body);
  resolve_model(f, config_.served_model_names);
  const json* ids = f.get("tokens");
  if (!ids) throw ApiError(400, "`tokens` is required", "tokens");
  const std::vector<int32_t> tokens = read_token_ids(*ids, "tokens");
  const int32_t vocab = svc.tokenizer->vocab_size();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= vocab)
      throw ApiError(400, fmt::format("`tokens[{}]` = {} is outside the vocabulary (size {})", i, tokens[i], vocab),
                     "tokens");
  send_json(res, {{"prompt", svc.tokenizer->decode(tokens)}});
}

}  // namespace moeserve::server
