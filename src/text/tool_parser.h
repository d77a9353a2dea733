// Tool-call parsers: turn generated text into OpenAI `tool_calls`, incrementally while
// streaming. One driver (this class) finds "<tool_call>" blocks in the content and hands
// each block's body to a format reader (tool_parser_hermes.cpp, tool_parser_qwen3_xml.cpp).
//
// `--tool-call-parser` names (vLLM's names for the same formats):
//   hermes       Qwen2.5 / Qwen3 JSON body: <tool_call>\n{"name": F, "arguments": {...}}\n</tool_call>
//   qwen3_coder  Qwen3-Coder / Qwen3.5 / Qwen3.6 XML body:
//   qwen3_xml      <tool_call>\n<function=F>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>
//                values typed by the request's tool schemas (tool_parser_schema.h)
//   qwen3        either body, chosen per block ('{' or '<function='): one name that serves
//                Qwen3 (hermes) and Qwen3.5 (XML) checkpoints alike
//
// Rules (the same for streaming and for one-shot parsing):
//   - Text outside blocks is content. Whitespace that only separates content from a block,
//     or blocks from each other, is template formatting and is dropped; if no call is
//     found, the content is the input unchanged.
//   - A block is a call only once it is complete: a block that is malformed (bad JSON, a
//     broken tag, unclosed at the end of the stream) is content, byte for byte, and text
//     after it is scanned again, so nothing is lost and a later block still parses.
//   - A complete call is emitted as two deltas: {index, id, type, name, arguments: ""},
//     then {index, arguments: <the whole JSON object text>}. Arguments are compact JSON.
//   - Tags split across pushes are never cut: the driver holds back only a possible
//     prefix of "<tool_call>" and trailing whitespace.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tool_parser_schema.h"

namespace moeserve::text {

class BlockScanner;

// A finished call, as in a non-streaming response's message.tool_calls[i].
struct ToolCall {
  std::string id;         // "call_" + 24 alphanumerics
  std::string name;
  std::string arguments;  // a JSON object text
  // {"id", "type": "function", "function": {"name", "arguments"}}
  nlohmann::json to_json() const;
  bool operator==(const ToolCall&) const = default;
};

// One element of a streaming chunk's delta.tool_calls. `id` and `name` are set in the
// first delta of a call only; `arguments` fragments concatenate to the call's arguments.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
  bool is_header() const { return !id.empty(); }
  // {"index", "id", "type": "function", "function": {"name", "arguments"}} with id, type
  // and name only in the header.
  nlohmann::json to_json() const;
  bool operator==(const ToolCallDelta&) const = default;
};

// A fresh tool-call id: "call_" followed by 24 random characters from [A-Za-z0-9].
std::string make_tool_call_id();

class ToolParser {
 public:
  struct Delta {
    std::string content;
    std::vector<ToolCallDelta> tool_calls;
    bool empty() const { return content.empty() && tool_calls.empty(); }
  };
  struct Result {
    std::string content;
    std::vector<ToolCall> tool_calls;
  };
  using IdGenerator = std::function<std::string()>;

  // The names `--tool-call-parser` accepts.
  static std::span<const std::string_view> names();

  // `tools` is the request's tools array (or null). Throws moeserve::Error on an unknown
  // name (listing the valid ones) or a malformed tools array. `ids` makes call ids
  // (default: make_tool_call_id).
  static std::unique_ptr<ToolParser> create(std::string_view name, const nlohmann::json& tools, IdGenerator ids = {});

  // Non-streaming: the result of a whole output (identical to push + finish).
  static Result parse(std::string_view name, const nlohmann::json& tools, std::string_view text,
                      IdGenerator ids = {});

  ~ToolParser();
  ToolParser(const ToolParser&) = delete;
  ToolParser& operator=(const ToolParser&) = delete;

  Delta push(std::string_view new_text);
  Delta finish();

  // Everything emitted so far, aggregated (final after finish()).
  const Result& result() const { return result_; }

 private:
  enum class Format { kHermes, kQwen3Xml, kAuto };
  ToolParser(Format format, ToolSchemas schemas, IdGenerator ids);

  void process(bool at_end, Delta& out);
  void emit_content(std::string_view text, Delta& out);
  void emit_call(std::string name, std::string arguments, Delta& out);
  std::unique_ptr<BlockScanner> start_block() const;

  Format format_;
  ToolSchemas schemas_;
  IdGenerator ids_;

  std::string pending_;               // unconsumed text; inside a block: its body so far
  std::string held_space_;            // whitespace after the last emitted content
  std::string block_separator_;       // the whitespace held when the current block opened
  std::unique_ptr<BlockScanner> block_;  // non-null while inside a block
  bool finished_ = false;
  Result result_;
};

}  // namespace moeserve::text
