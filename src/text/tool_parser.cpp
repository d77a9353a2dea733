#include "text/tool_parser.h"

#include <array>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "text/parser_tags.h"
#include "text/tool_parser_format.h"

namespace moeserve::text {
namespace {

constexpr std::array<std::string_view, 4> kNames = {"hermes", "qwen3", "qwen3_coder", "qwen3_xml"};

}  // namespace

nlohmann::json ToolCall::to_json() const {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

nlohmann::json ToolCallDelta::to_json() const {
  nlohmann::json j = {{"index", index}};
  nlohmann::json function = nlohmann::json::object();
  if (is_header()) {
    j["id"] = id;
    j["type"] = "function";
    function["name"] = name;
  }
  function["arguments"] = arguments;
  j["function"] = std::move(function);
  return j;
}

std::string make_tool_call_id() {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<std::size_t> pick(0, kAlphabet.size() - 1);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

std::span<const std::string_view> ToolParser::names() { return kNames; }

std::unique_ptr<ToolParser> ToolParser::create(std::string_view name, const nlohmann::json& tools, IdGenerator ids) {
  Format format;
  if (name == "hermes") {
    format = Format::kHermes;
  } else if (name == "qwen3") {
    format = Format::kAuto;
  } else if (name == "qwen3_coder" || name == "qwen3_xml") {
    format = Format::kQwen3Xml;
  } else {
    fail("unknown tool-call parser '{}' (valid: {})", name, fmt::join(kNames, ", "));
  }
  if (!ids) ids = make_tool_call_id;
  return std::unique_ptr<ToolParser>(new ToolParser(format, ToolSchemas::from_json(tools), std::move(ids)));
}

ToolParser::Result ToolParser::parse(std::string_view name, const nlohmann::json& tools, std::string_view text,
                                     IdGenerator ids) {
  std::unique_ptr<ToolParser> parser = create(name, tools, std::move(ids));
  parser->push(text);
  parser->finish();
  return parser->result();
}

ToolParser::ToolParser(Format format, ToolSchemas schemas, IdGenerator ids)
    : format_(format), schemas_(std::move(schemas)), ids_(std::move(ids)) {}

ToolParser::~ToolParser() = default;

ToolParser::Delta ToolParser::push(std::string_view new_text) {
  MOESERVE_CHECK(!finished_, "ToolParser::push after finish");
  Delta out;
  pending_.append(new_text);
  process(/*at_end=*/false, out);
  return out;
}

ToolParser::Delta ToolParser::finish() {
  Delta out;
  if (finished_) return out;
  process(/*at_end=*/true, out);
  // Trailing whitespace: template formatting after a call, but the text itself when the
  // output had no call (the parser is then transparent).
  if (result_.tool_calls.empty()) {
    out.content += held_space_;
    result_.content += held_space_;
  }
  held_space_.clear();
  finished_ = true;
  return out;
}

std::unique_ptr<BlockScanner> ToolParser::start_block() const {
  switch (format_) {
    case Format::kHermes: return make_hermes_block_scanner();
    case Format::kQwen3Xml: return make_qwen3_xml_block_scanner(schemas_);
    case Format::kAuto: return make_auto_block_scanner(schemas_);
  }
  return nullptr;
}

void ToolParser::process(bool at_end, Delta& out) {
  for (;;) {
    if (!block_) {
      const std::size_t open = pending_.find(kToolCallOpen);
      if (open == std::string::npos) {
        const std::size_t keep = at_end ? 0 : partial_tag_suffix(pending_, kToolCallOpen);
        emit_content(std::string_view(pending_).substr(0, pending_.size() - keep), out);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      emit_content(std::string_view(pending_).substr(0, open), out);
      pending_.erase(0, open + kToolCallOpen.size());
      block_separator_ = std::move(held_space_);
      held_space_.clear();
      block_ = start_block();
      continue;
    }
    BlockScan scan = block_->scan(pending_, at_end);
    if (scan.status == BlockScan::Status::kNeedMore) {
      if (!at_end) return;
      scan = BlockScan::malformed(pending_.size());  // scanners resolve at_end; be safe anyway
    }
    if (scan.status == BlockScan::Status::kComplete) {
      for (ParsedFunctionCall& call : scan.calls) emit_call(std::move(call.name), std::move(call.arguments), out);
    } else {
      std::string text = block_separator_;
      text += kToolCallOpen;
      text.append(pending_, 0, scan.end);
      emit_content(text, out);
    }
    pending_.erase(0, scan.end);
    block_separator_.clear();
    block_.reset();
  }
}

void ToolParser::emit_content(std::string_view text, Delta& out) {
  const std::size_t last = text.find_last_not_of(" \t\n\r");
  if (last == std::string_view::npos) {
    held_space_.append(text);
    return;
  }
  const std::string_view body = text.substr(0, last + 1);
  for (std::string* sink : {&out.content, &result_.content}) {
    sink->append(held_space_);
    sink->append(body);
  }
  held_space_.assign(text.substr(last + 1));
}

void ToolParser::emit_call(std::string name, std::string arguments, Delta& out) {
  const int index = static_cast<int>(result_.tool_calls.size());
  std::string id = ids_();
  out.tool_calls.push_back({index, id, name, ""});
  out.tool_calls.push_back({index, "", "", arguments});
  result_.tool_calls.push_back({std::move(id), std::move(name), std::move(arguments)});
}

}  // namespace moeserve::text
