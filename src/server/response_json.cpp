#include "server/response_json.h"

#include "server/sse.h"
#include "server/utf8.h"

#include <chrono>
#include <random>
#include <set>

#include <fmt/format.h>

namespace moeserve::server {

using nlohmann::json;

std::string make_response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

int64_t unix_time_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json session_usage(const GenerationSession& session) {
  int64_t prompt = 0, completion = 0;
  std::set<int> prompts_seen;
  for (size_t i = 0; i < session.num_choices(); ++i) {
    const auto& spec = session.spec(i);
    if (prompts_seen.insert(spec.prompt_index).second) prompt += int64_t(spec.prompt.size());
    completion += session.decoder(i).completion_tokens();
  }
  return usage_json(prompt, completion);
}

// ---- chat ------------------------------------------------------------------------------

ChatResponseBuilder::ChatResponseBuilder(ResponseHeader header, const LogprobFormatter& logprobs,
                                         ChatResponseOptions options)
    : header_(std::move(header)), logprobs_(logprobs), options_(options) {}

json ChatResponseBuilder::chunk(json choice) const {
  return {{"id", header_.id},
          {"object", "chat.completion.chunk"},
          {"created", header_.created},
          {"model", header_.model},
          {"choices", json::array({std::move(choice)})}};
}

std::string ChatResponseBuilder::stream_head(const GenerationSession& session) const {
  std::string out;
  for (size_t i = 0; i < session.num_choices(); ++i)
    out += sse_event(chunk({{"index", i},
                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                            {"logprobs", nullptr},
                            {"finish_reason", nullptr}}));
  return out;
}

std::optional<json> ChatResponseBuilder::update_chunk(const GenerationSession& session,
                                                      const GenerationSession::ChoiceUpdate& u) {
  const auto& update = u.update;
  json delta = json::object();
  if (!update.parsed.reasoning.empty()) delta["reasoning_content"] = update.parsed.reasoning;
  if (!update.parsed.content.empty()) delta["content"] = update.parsed.content;
  json calls = json::array();
  for (const auto& call : update.parsed.tool_calls)
    if (options_.parallel_tool_calls || call.index == 0) calls.push_back(call.to_json());
  if (!calls.empty()) delta["tool_calls"] = std::move(calls);

  const bool has_logprobs = options_.logprobs && !update.logprobs.empty();
  if (delta.empty() && !has_logprobs && !update.finished) return std::nullopt;
  json c = {{"index", u.choice}, {"delta", std::move(delta)}};
  c["logprobs"] = has_logprobs ? json{{"content", logprobs_.chat_content(update.logprobs)}} : json(nullptr);
  if (update.finished) {
    const auto& d = session.decoder(size_t(u.choice));
    c["finish_reason"] = d.finish_reason();
    c["stop_reason"] = d.stop_reason();
  } else {
    c["finish_reason"] = nullptr;
  }
  return chunk(std::move(c));
}

json ChatResponseBuilder::usage_chunk(const json& usage) const {
  return {{"id", header_.id},
          {"object", "chat.completion.chunk"},
          {"created", header_.created},
          {"model", header_.model},
          {"choices", json::array()},
          {"usage", usage}};
}

json ChatResponseBuilder::response(const GenerationSession& session) const {
  json choices = json::array();
  for (size_t i = 0; i < session.num_choices(); ++i) {
    const auto& d = session.decoder(i);
    const auto* parsed = d.parsed();
    const std::string content = parsed ? parsed->content : d.text();
    const std::string reasoning = parsed ? parsed->reasoning_content : "";
    json calls = json::array();
    if (parsed)
      for (const auto& call : parsed->tool_calls) {
        if (!options_.parallel_tool_calls && !calls.empty()) break;
        calls.push_back(call.to_json());
      }
    json message = {{"role", "assistant"}};
    // vLLM's shape: content null when the output was all reasoning or all tool calls.
    message["content"] =
        content.empty() && (!calls.empty() || !reasoning.empty()) ? json(nullptr) : json(content);
    message["reasoning_content"] = reasoning.empty() ? json(nullptr) : json(reasoning);
    message["tool_calls"] = std::move(calls);
    json choice = {{"index", i}, {"message", std::move(message)}};
    choice["logprobs"] =
        options_.logprobs ? json{{"content", logprobs_.chat_content(d.logprobs())}} : json(nullptr);
    choice["finish_reason"] = d.finish_reason();
    choice["stop_reason"] = d.stop_reason();
    choices.push_back(std::move(choice));
  }
  json out = {{"id", header_.id},
              {"object", "chat.completion"},
              {"created", header_.created},
              {"model", header_.model},
              {"choices", std::move(choices)},
              {"usage", session_usage(session)}};
  out["prompt_logprobs"] = options_.prompt_logprobs && session.num_choices() > 0
                               ? logprobs_.prompt_logprobs(session.decoder(0).prompt_logprobs())
                               : json(nullptr);
  return out;
}

// ---- completions -----------------------------------------------------------------------

CompletionResponseBuilder::CompletionResponseBuilder(ResponseHeader header,
                                                     const LogprobFormatter& logprobs,
                                                     CompletionResponseOptions options)
    : header_(std::move(header)), logprobs_(logprobs), options_(std::move(options)) {}

json CompletionResponseBuilder::chunk(json choice) const {
  return {{"id", header_.id},
          {"object", "text_completion"},
          {"created", header_.created},
          {"model", header_.model},
          {"choices", json::array({std::move(choice)})}};
}

std::optional<json> CompletionResponseBuilder::update_chunk(const GenerationSession& session,
                                                            const GenerationSession::ChoiceUpdate& u) {
  const auto& update = u.update;
  const size_t i = size_t(u.choice);
  if (started_.size() < session.num_choices()) started_.resize(session.num_choices(), false);
  const auto& d = session.decoder(i);
  const auto& spec = session.spec(i);
  const bool with_echo = options_.echo && !started_[i];
  const std::string& echo_text =
      options_.echo ? options_.echo_texts[size_t(spec.prompt_index)] : std::string();
  std::string text = with_echo ? echo_text + update.text : update.text;
  const bool has_logprobs = options_.logprobs && (!update.logprobs.empty() || with_echo);
  if (text.empty() && !has_logprobs && !update.finished) return std::nullopt;
  started_[i] = true;
  json c = {{"index", u.choice}, {"text", std::move(text)}};
  if (!has_logprobs)
    c["logprobs"] = nullptr;
  else if (with_echo)
    c["logprobs"] = logprobs_.completion_with_prompt(spec.prompt, d.prompt_logprobs(), update.logprobs,
                                                     update.text_offsets);
  else
    c["logprobs"] = logprobs_.completion(update.logprobs, update.text_offsets, int(utf8_length(echo_text)));
  if (update.finished) {
    c["finish_reason"] = d.finish_reason();
    c["stop_reason"] = d.stop_reason();
  } else {
    c["finish_reason"] = nullptr;
  }
  return chunk(std::move(c));
}

json CompletionResponseBuilder::usage_chunk(const json& usage) const {
  return {{"id", header_.id},
          {"object", "text_completion"},
          {"created", header_.created},
          {"model", header_.model},
          {"choices", json::array()},
          {"usage", usage}};
}

json CompletionResponseBuilder::response(const GenerationSession& session) const {
  json choices = json::array();
  for (size_t i = 0; i < session.num_choices(); ++i) {
    const auto& d = session.decoder(i);
    const auto& spec = session.spec(i);
    const std::string echo_text =
        options_.echo ? options_.echo_texts[size_t(spec.prompt_index)] : std::string();
    json choice = {{"index", i}, {"text", echo_text + d.text()}};
    if (!options_.logprobs)
      choice["logprobs"] = nullptr;
    else if (options_.echo)
      choice["logprobs"] = logprobs_.completion_with_prompt(spec.prompt, d.prompt_logprobs(), d.logprobs(),
                                                            d.text_offsets());
    else
      choice["logprobs"] = logprobs_.completion(d.logprobs(), d.text_offsets(), 0);
    choice["finish_reason"] = d.finish_reason();
    choice["stop_reason"] = d.stop_reason();
    choice["prompt_logprobs"] =
        options_.prompt_logprobs ? logprobs_.prompt_logprobs(d.prompt_logprobs()) : json(nullptr);
    choices.push_back(std::move(choice));
  }
  return {{"id", header_.id},
          {"object", "text_completion"},
          {"created", header_.created},
          {"model", header_.model},
          {"choices", std::move(choices)},
          {"usage", session_usage(session)}};
}

}  // namespace moeserve::server
