// One choice of a generation request, from engine outputs to response text:
//   token ids -> streaming detokenizer -> stop strings -> (chat) reasoning/tool-call parser.
// consume() takes each engine output in order and returns what it adds to the choice (the
// text of a streaming chunk, or nothing yet while a stop string or a tag is half seen);
// once the engine's final output arrives the choice is finished and its totals are final.
// When a stop string appears the choice finishes at once (text cut before it) and the caller
// cancels the engine request with FinishReason::Stop; later outputs are ignored.
#pragma once
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/request_output.h"
#include "server/stop_matcher.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace moeserve::server {

struct ChoiceDecoderOptions {
  bool skip_special_tokens = true;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  // Eos ids end a choice with stop_reason null; other stop tokens are reported by id.
  std::unordered_set<int32_t> eos_token_ids;
  // Completions echo with max_tokens 0: generated tokens are dropped, the choice is the
  // prompt alone (finish_reason "length").
  bool discard_generated = false;

  // Chat only: split the text into reasoning / content / tool calls.
  bool parse_output = false;
  std::string reasoning_parser;  // "" for none
  std::string tool_parser;       // "" for none (tool_choice "none" or no tools)
  nlohmann::json tools;          // the request's tools (null if none)
  bool prompt_ends_in_think = false;
  // Text the prompt already wrote at the start of the assistant turn (forced tool calls):
  // the parser sees it first, the client never receives it as text.
  std::string parser_prefix;
  // finish_reason "tool_calls" when calls were parsed (tool_choice auto/required; a named
  // tool_choice finishes with "stop", as vLLM does).
  bool tool_calls_finish_reason = true;
  text::ToolParser::IdGenerator tool_call_ids;
};

class ChoiceDecoder {
 public:
  struct Update {
    std::string text;                      // raw text released by this output
    text::OutputParser::Delta parsed;      // chat: the same text, split
    std::vector<runtime::TokenLogprob> logprobs;  // of the tokens consumed by this output
    std::vector<int> text_offsets;         // per token above: characters of text before it
    bool finished = false;                 // this output finished the choice
    bool empty() const { return text.empty() && parsed.empty() && logprobs.empty() && !finished; }
  };

  // `tokenizer` must outlive the decoder. Throws moeserve::Error for an unknown parser name
  // or malformed tools.
  ChoiceDecoder(const text::Tokenizer& tokenizer, ChoiceDecoderOptions options);

  Update consume(const runtime::RequestOutput& output);

  bool finished() const { return finished_; }
  // True once a stop string ended the choice while the engine may still be generating.
  bool hit_stop_string() const { return stop_string_.has_value(); }

  // Final values (valid once finished()).
  std::string finish_reason() const;   // "stop", "length", "tool_calls" or "abort"
  nlohmann::json stop_reason() const;  // the stop string, a stop token id, or null
  const std::string& error() const { return error_; }
  int prompt_tokens() const { return prompt_tokens_; }
  int completion_tokens() const { return completion_tokens_; }
  const std::string& text() const { return text_; }
  // Chat: the parsed message (final once finished()).
  const text::OutputParser::Result* parsed() const;
  const std::vector<runtime::TokenLogprob>& logprobs() const { return logprobs_; }
  const std::vector<int>& text_offsets() const { return text_offsets_; }
  const std::vector<std::optional<runtime::TokenLogprob>>& prompt_logprobs() const {
    return prompt_logprobs_;
  }

 private:
  void release(std::string piece, Update& update);
  void finish(const runtime::RequestOutput& output, Update& update);

  ChoiceDecoderOptions options_;
  text::StreamingDetokenizer detokenizer_;
  StopStringMatcher stops_;
  std::optional<text::OutputParser> parser_;

  bool finished_ = false;
  runtime::FinishReason engine_finish_ = runtime::FinishReason::None;
  std::optional<int32_t> stop_token_;
  std::optional<std::string> stop_string_;
  std::string error_;
  int prompt_tokens_ = 0;
  int completion_tokens_ = 0;
  size_t raw_chars_ = 0;  // code points of detokenized text so far (text_offset)
  std::string text_;
  std::vector<runtime::TokenLogprob> logprobs_;
  std::vector<int> text_offsets_;
  std::vector<std::optional<runtime::TokenLogprob>> prompt_logprobs_;
};

}  // namespace moeserve::server
