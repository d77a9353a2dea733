// Internal interface between the streaming tool-call driver (tool_parser.cpp) and the
// per-format readers of one "<tool_call> ... </tool_call>" block (tool_parser_hermes,
// tool_parser_qwen3_xml). The driver finds the opening tag in content; a BlockScanner
// then reads the block's body as it grows and says when it is complete or malformed.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::text {

class ToolSchemas;

// One parsed function call: its name and its arguments as a JSON object text.
struct ParsedFunctionCall {
  std::string name;
  std::string arguments;
};

struct BlockScan {
  enum class Status {
    kNeedMore,   // the body so far is a valid beginning: wait for more text
    kComplete,   // a well-formed block ending in "</tool_call>"
    kMalformed,  // not a tool call: its text is content
  };
  Status status = Status::kNeedMore;
  // kComplete: body bytes through "</tool_call>". kMalformed: body bytes that belong to
  // the failed block (they become content with the opening tag); the driver scans the
  // rest as content again, so a later real "<tool_call>" is still found.
  std::size_t end = 0;
  std::vector<ParsedFunctionCall> calls;  // kComplete only

  static BlockScan need_more() { return {}; }
  static BlockScan malformed(std::size_t end) { return {Status::kMalformed, end, {}}; }
};

// Reads the body of one block: the text after "<tool_call>". scan() is called again each
// time the body grows (always the whole body so far, the earlier bytes unchanged); a
// scanner keeps its position, so total work is linear in the body size. A decision other
// than kNeedMore is final and never depends on where the text was split. With `at_end`
// (no more text will come) the answer is kComplete or kMalformed.
class BlockScanner {
 public:
  virtual ~BlockScanner() = default;
  virtual BlockScan scan(std::string_view body, bool at_end) = 0;
};

constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";

// Hermes / Qwen3: "<tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call>".
std::unique_ptr<BlockScanner> make_hermes_block_scanner();

// Qwen3-Coder / Qwen3.5 XML: "<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n
// </parameter>\n</function>\n</tool_call>", values typed by `schemas`.
std::unique_ptr<BlockScanner> make_qwen3_xml_block_scanner(const ToolSchemas& schemas);

// Either of the two, chosen per block by its first non-space byte ('{' or '<').
std::unique_ptr<BlockScanner> make_auto_block_scanner(const ToolSchemas& schemas);

}  // namespace moeserve::text
