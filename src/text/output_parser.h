// The per-choice output parser the server runs on generated text: the reasoning parser
// first, then the tool-call parser on what the reasoning parser calls content.
//
// Tool calls inside the think block are not parsed: text before "</think>" is
// reasoning_content only. This is the order the Qwen3 and Qwen3.5 chat templates render
// an assistant turn in (spec qwen35_arch.md section 5): "<think>\n{reasoning}\n</think>\n\n"
// first, then the content, then the "<tool_call>" blocks, so a model that follows its
// template calls tools after the think block; a "<tool_call>" the model writes while
// thinking is part of its thoughts (vLLM's qwen3 parser does the same when the block is
// closed).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/reasoning_parser.h"
#include "text/tool_parser.h"

namespace moeserve::text {

class OutputParser {
 public:
  struct Delta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCallDelta> tool_calls;
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  };
  // The whole message so far (final after finish()). Empty strings mean absent (null in
  // the response).
  struct Result {
    std::string reasoning_content;
    std::string content;
    std::vector<ToolCall> tool_calls;
    // Whether the server reports finish_reason "tool_calls" (in place of "stop"): at
    // least one call was parsed.
    bool finished_with_tool_calls() const { return !tool_calls.empty(); }
  };

  // `reasoning_parser` / `tool_parser`: a name from ReasoningParser::names() /
  // ToolParser::names(), or "" / "none" for no parser. `tools`: the request's tools
  // array (null if none). `prompt_ends_in_think`: see prompt_ends_in_open_think().
  // Throws moeserve::Error on unknown names or a malformed tools array.
  OutputParser(std::string_view reasoning_parser, std::string_view tool_parser, const nlohmann::json& tools,
               bool prompt_ends_in_think, ToolParser::IdGenerator ids = {});

  // Feeds the next piece of generated text (any size, split anywhere).
  Delta push(std::string_view new_text);
  // The end of generation: emits everything held back. Further calls return nothing;
  // push() after finish() throws.
  Delta finish();
  const Result& result() const { return result_; }

 private:
  void route(ReasoningParser::Delta split, bool at_end, Delta& out);

  std::unique_ptr<ReasoningParser> reasoning_;
  std::unique_ptr<ToolParser> tools_;
  Result result_;
  bool finished_ = false;
};

}  // namespace moeserve::text
