// POST /v1/chat/completions: validate, render the chat template, tokenize, submit one engine
// request per choice, respond (openai_respond.cpp).
#include <fmt/format.h>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/forced_tool_call.h"
#include "server/openai_server.h"
#include "text/reasoning_parser.h"

namespace moeserve::server {

using nlohmann::json;

void OpenAiServer::handle_chat(const httplib::Request& req, httplib::Response& res) {
  const auto arrival = GenerationSession::Clock::now();
  const ModelServices& svc = services();
  const json body = parse_body(req);
  ChatRequest r = parse_chat_request(body, config_.served_model_names, config_.limits,
                                     ToolSettings{config_.enable_auto_tool_choice, config_.tool_call_parser},
                                     config_.default_chat_template_kwargs, config_.sampling_defaults);
  const bool json_output = r.generation.response_format.type != ResponseFormat::Type::Text;
  if (json_output && (r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named))
    throw ApiError(400, "`response_format` cannot be combined with a `tool_choice` that forces a tool call",
                   "response_format");
  if (!svc.render_chat)
    throw ApiError(400, "This model has no chat template; start the server with --chat-template, or "
                        "use /v1/completions.");

  std::string prompt;
  try {
    prompt = svc.render_chat(ChatPromptRequest{r.messages, r.tools, r.add_generation_prompt,
                                               r.continue_final_message, r.chat_template_kwargs});
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("The chat template rejected the request: {}", e.what()), "messages");
  }

  bool ends_in_think = text::prompt_ends_in_open_think(prompt);
  std::string parser_prefix;
  if (r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) {
    const ForcedToolCall forced = forced_tool_call(
        config_.tool_call_parser, r.tool_choice == ToolChoice::Named ? r.named_tool : "", prompt,
        ends_in_think);
    prompt += forced.prompt_suffix;
    parser_prefix = forced.parser_prefix;
    ends_in_think = false;
  }
  auto& gen = r.generation;
  if (json_output) {
    // A model that thinks first (the prompt leaves <think> open and a reasoning parser splits
    // the output) writes the JSON after </think>.
    std::optional<int32_t> start_after;
    if (!config_.reasoning_parser.empty() && ends_in_think && !config_.structured_outputs.enable_in_reasoning)
      start_after = svc.tokenizer->token_to_id(text::kThinkClose);
    gen.sampling.constraint = structured_->factory(gen.response_format, req.body, start_after);
  }

  std::vector<int32_t> tokens;
  try {
    tokens = svc.tokenizer->encode(prompt, /*add_special_tokens=*/false);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("Cannot tokenize the prompt: {}", e.what()), "messages");
  }
  finalize_max_tokens(gen, int(tokens.size()), config_.limits, Endpoint::Chat);
  add_model_stop_tokens(gen.sampling, svc);

  ChoiceDecoderOptions decoder;
  decoder.skip_special_tokens = gen.skip_special_tokens;
  decoder.stop = gen.stop;
  decoder.include_stop_str_in_output = gen.include_stop_str_in_output;
  decoder.eos_token_ids = svc.eos_token_ids;
  decoder.parse_output = true;
  decoder.reasoning_parser = config_.reasoning_parser;
  decoder.tool_parser = r.tool_choice == ToolChoice::None ? "" : config_.tool_call_parser;
  decoder.tools = r.tools;
  decoder.prompt_ends_in_think = ends_in_think;
  decoder.parser_prefix = parser_prefix;
  decoder.tool_calls_finish_reason = r.tool_choice != ToolChoice::Named;

  std::vector<ChoiceSpec> choices;
  for (int i = 0; i < gen.n; ++i) {
    ChoiceSpec spec{tokens, gen.sampling, decoder, 0};
    if (gen.sampling.seed) spec.sampling.seed = *gen.sampling.seed + uint64_t(i);
    choices.push_back(std::move(spec));
  }
  auto session = new_session(arrival);
  session->start(std::move(choices));

  ChatResponseOptions options;
  options.logprobs = gen.sampling.logprobs >= 0;
  options.prompt_logprobs = gen.sampling.prompt_logprobs >= 0;
  options.parallel_tool_calls = r.parallel_tool_calls;
  auto builder = std::make_shared<ChatResponseBuilder>(
      ResponseHeader{make_response_id("chatcmpl-"), unix_time_now(), r.model}, *logprob_formatter_,
      options);
  respond(res, std::move(session), std::move(builder), gen);
}

}  // namespace moeserve::server
