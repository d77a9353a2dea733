// tool_choice "required" and {"type": "function", "function": {"name": F}} without a
// grammar engine: the assistant turn is started for the model with the opening of a call in
// the syntax its tool parser reads, so the model can only continue it:
//   qwen3_coder / qwen3_xml (Qwen3.5):  "<tool_call>\n<function=F>\n"   (named)
//   hermes (Qwen3):                     "<tool_call>\n{\"name\": \"F\", \"arguments\": "  (named)
//   any format, required:               "<tool_call>\n"
// (`qwen3` picks the XML or JSON form by what the rendered prompt teaches: "<function=".)
// A thinking prompt ("...<think>\n") gets its think block closed first, the way the template
// renders thinking off, since the call must come before anything else. vLLM forces the
// same outcomes with guided decoding; here the parser reads the prefix as if generated, so
// the response carries the completed call.
#pragma once
#include <optional>
#include <string>

namespace moeserve::server {

struct ForcedToolCall {
  std::string prompt_suffix;  // appended to the rendered prompt
  std::string parser_prefix;  // fed to the output parser before the generated text
};

// `named_tool` empty for "required". Throws ApiError(400) for a parser with no known syntax.
ForcedToolCall forced_tool_call(const std::string& tool_call_parser, const std::string& named_tool,
                                const std::string& rendered_prompt, bool prompt_ends_in_think);

}  // namespace moeserve::server
