#include "server/forced_tool_call.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace moeserve::server {

ForcedToolCall forced_tool_call(const std::string& parser, const std::string& named_tool,
                                const std::string& rendered_prompt, bool prompt_ends_in_think) {
  bool xml;
  if (parser == "qwen3_coder" || parser == "qwen3_xml") xml = true;
  else if (parser == "hermes") xml = false;
  else if (parser == "qwen3") xml = rendered_prompt.find("<function=") != std::string::npos;
  else
    throw ApiError(400, fmt::format("tool_choice \"required\" or a named function is not supported "
                                    "with --tool-call-parser {}",
                                    parser),
                   "tool_choice");
  ForcedToolCall f;
  // The Qwen templates render thinking off as an empty block: "<think>\n\n</think>\n\n".
  if (prompt_ends_in_think) f.prompt_suffix = "\n</think>\n\n";
  f.parser_prefix = "<tool_call>\n";
  if (!named_tool.empty()) {
    if (xml) f.parser_prefix += "<function=" + named_tool + ">\n";
    else f.parser_prefix += "{\"name\": " + nlohmann::json(named_tool).dump() + ", \"arguments\": ";
  }
  f.prompt_suffix += f.parser_prefix;
  return f;
}

}  // namespace moeserve::server
