#include "text/output_parser.h"

#include "core/error.h"

namespace moeserve::text {
namespace {

bool is_none(std::string_view name) { return name.empty() || name == "none"; }

}  // namespace

OutputParser::OutputParser(std::string_view reasoning_parser, std::string_view tool_parser,
                           const nlohmann::json& tools, bool prompt_ends_in_think, ToolParser::IdGenerator ids) {
  if (!is_none(reasoning_parser)) reasoning_ = ReasoningParser::create(reasoning_parser, prompt_ends_in_think);
  if (!is_none(tool_parser)) tools_ = ToolParser::create(tool_parser, tools, std::move(ids));
}

OutputParser::Delta OutputParser::push(std::string_view new_text) {
  MOESERVE_CHECK(!finished_, "OutputParser::push after finish");
  Delta out;
  ReasoningParser::Delta split = reasoning_ ? reasoning_->push(new_text) : ReasoningParser::Delta{"", std::string(new_text)};
  route(std::move(split), /*at_end=*/false, out);
  return out;
}

OutputParser::Delta OutputParser::finish() {
  Delta out;
  if (finished_) return out;
  finished_ = true;
  ReasoningParser::Delta split = reasoning_ ? reasoning_->finish() : ReasoningParser::Delta{};
  route(std::move(split), /*at_end=*/true, out);
  return out;
}

void OutputParser::route(ReasoningParser::Delta split, bool at_end, Delta& out) {
  out.reasoning = std::move(split.reasoning);
  result_.reasoning_content += out.reasoning;
  if (!tools_) {
    out.content = std::move(split.content);
    result_.content += out.content;
    return;
  }
  ToolParser::Delta parsed = tools_->push(split.content);
  if (at_end) {
    ToolParser::Delta tail = tools_->finish();
    parsed.content += tail.content;
    for (ToolCallDelta& d : tail.tool_calls) parsed.tool_calls.push_back(std::move(d));
  }
  out.content = std::move(parsed.content);
  out.tool_calls = std::move(parsed.tool_calls);
  result_.content += out.content;
  const std::vector<ToolCall>& calls = tools_->result().tool_calls;
  result_.tool_calls.insert(result_.tool_calls.end(), calls.begin() + static_cast<std::ptrdiff_t>(result_.tool_calls.size()),
                            calls.end());
}

}  // namespace moeserve::text
