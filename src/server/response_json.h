// The OpenAI response bodies, for chat and completions, whole and as stream chunks (the
// same field set vLLM sends; `reasoning_content` and `stop_reason` are vLLM's additions).
//
//   chat.completion        {id, object, created, model, choices: [{index, message: {role,
//                           content, reasoning_content, tool_calls}, logprobs, finish_reason,
//                           stop_reason}], usage, prompt_logprobs}
//   chat.completion.chunk  {id, object, created, model, choices: [{index, delta, logprobs,
//                           finish_reason, stop_reason}], usage?}
//   text_completion        {id, object, created, model, choices: [{index, text, logprobs,
//                           finish_reason, stop_reason, prompt_logprobs}], usage}
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/choice_decoder.h"
#include "server/generation_session.h"
#include "server/logprobs_json.h"

namespace moeserve::server {

struct ResponseHeader {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

// A random id with the given prefix ("chatcmpl-", "cmpl-"): 32 hex digits.
std::string make_response_id(const std::string& prefix);
int64_t unix_time_now();

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// Usage of a whole session: every distinct prompt once, every choice's generated tokens.
nlohmann::json session_usage(const GenerationSession& session);

// Builds one endpoint's bodies from a session. Streaming: stream_head() once, then
// update_chunk() for every update, then usage_chunk() (with include_usage); otherwise
// response() once every choice has finished.
class ResponseBuilder {
 public:
  virtual ~ResponseBuilder() = default;
  virtual std::string stream_head(const GenerationSession& session) const = 0;
  // nullopt when the update carries nothing to send.
  virtual std::optional<nlohmann::json> update_chunk(const GenerationSession& session,
                                                     const GenerationSession::ChoiceUpdate& u) = 0;
  virtual nlohmann::json usage_chunk(const nlohmann::json& usage) const = 0;
  virtual nlohmann::json response(const GenerationSession& session) const = 0;
};

struct ChatResponseOptions {
  bool logprobs = false;
  bool prompt_logprobs = false;
  bool parallel_tool_calls = true;
};

class ChatResponseBuilder final : public ResponseBuilder {
 public:
  ChatResponseBuilder(ResponseHeader header, const LogprobFormatter& logprobs, ChatResponseOptions options);

  // The first chunk of each choice announces the role.
  std::string stream_head(const GenerationSession& session) const override;
  std::optional<nlohmann::json> update_chunk(const GenerationSession& session,
                                             const GenerationSession::ChoiceUpdate& u) override;
  nlohmann::json usage_chunk(const nlohmann::json& usage) const override;
  nlohmann::json response(const GenerationSession& session) const override;

 private:
  nlohmann::json chunk(nlohmann::json choice) const;

  ResponseHeader header_;
  const LogprobFormatter& logprobs_;
  ChatResponseOptions options_;
};

struct CompletionResponseOptions {
  bool logprobs = false;
  bool prompt_logprobs = false;
  bool echo = false;
  std::vector<std::string> echo_texts;  // per prompt, when echo is on
};

class CompletionResponseBuilder final : public ResponseBuilder {
 public:
  CompletionResponseBuilder(ResponseHeader header, const LogprobFormatter& logprobs,
                            CompletionResponseOptions options);

  std::string stream_head(const GenerationSession&) const override { return ""; }
  // With echo, a choice's first chunk opens with the prompt text (and its logprobs).
  std::optional<nlohmann::json> update_chunk(const GenerationSession& session,
                                             const GenerationSession::ChoiceUpdate& u) override;
  nlohmann::json usage_chunk(const nlohmann::json& usage) const override;
  nlohmann::json response(const GenerationSession& session) const override;

 private:
  nlohmann::json chunk(nlohmann::json choice) const;

  ResponseHeader header_;
  const LogprobFormatter& logprobs_;
  CompletionResponseOptions options_;
  std::vector<bool> started_;  // per choice: its first chunk was sent
};

}  // namespace moeserve::server
