// Qwen3-Coder / Qwen3.5 / Qwen3.6 XML tool-call blocks. The Qwen3.5 chat template renders
// a past call as (spec qwen35_arch.md section 5)
//   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// where VALUE is a string as is, a mapping or list as JSON (`| tojson`) and any other
// scalar through Python's str() (`| string`: True, False, None, 1.5). Values are typed
// back by the tool's JSON schema (tool_parser_schema.h).
//
// Grammar read here (whitespace between tags is free):
//   body     := function+ "</tool_call>"
//   function := "<function=" NAME ">" param* "</function>"
//   param    := "<parameter=" NAME ">" VALUE "</parameter>"
// A value is raw text, so it may itself contain "</parameter>" (code that mentions the
// format): a "</parameter>" ends the value only when the next non-space text is
// "<parameter=" or "</function>". Exactly one newline is stripped from each end of a value.
// Several functions in one block become several calls.
#include <nlohmann/json.hpp>

#include "text/parser_tags.h"
#include "text/tool_parser_format.h"
#include "text/tool_parser_schema.h"

namespace moeserve::text {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

// A function name is an identifier-like token: template syntax, quotes or spaces mean
// the model wrote pseudo-XML (an unrendered "<function={{ name }}>"), not a call.
bool allowed_in_function_name(char c) {
  switch (c) {
    case '{': case '}': case '<': case '"': case '\'': case ' ': case '\t': case '\n': case '\r': return false;
    default: return true;
  }
}
bool allowed_in_parameter_name(char c) { return c != '<' && c != '\n' && c != '\r'; }

std::string_view strip_one_newline(std::string_view value) {
  if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
  if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
  return value;
}

class Qwen3XmlBlockScanner final : public BlockScanner {
 public:
  explicit Qwen3XmlBlockScanner(const ToolSchemas& schemas) : schemas_(schemas) {}

  BlockScan scan(std::string_view body, bool at_end) override {
    BlockScan result = step(body);
    if (result.status == BlockScan::Status::kNeedMore && at_end) return BlockScan::malformed(body.size());
    return result;
  }

 private:
  enum class State { kBeforeFunction, kFunctionName, kInFunction, kParameterName, kValue, kAfterFunction };

  BlockScan step(std::string_view body) {
    for (;;) {
      switch (state_) {
        case State::kBeforeFunction:
        case State::kAfterFunction: {
          pos_ = skip_template_space(body, pos_);
          if (pos_ == body.size()) return BlockScan::need_more();
          const std::string_view rest = body.substr(pos_);
          TagMatch close = TagMatch::kNone;
          if (state_ == State::kAfterFunction) {
            close = match_tag_at_start(rest, kToolCallClose);
            if (close == TagMatch::kFull) {
              return {BlockScan::Status::kComplete, pos_ + kToolCallClose.size(), std::move(calls_)};
            }
          }
          const TagMatch open = match_tag_at_start(rest, kFunctionOpen);
          if (open == TagMatch::kFull) {
            begin_tag(kFunctionOpen, State::kFunctionName);
            continue;
          }
          if (open == TagMatch::kPartial || close == TagMatch::kPartial) return BlockScan::need_more();
          return BlockScan::malformed(pos_);
        }
        case State::kFunctionName:
        case State::kParameterName: {
          const bool function = state_ == State::kFunctionName;
          for (; pos_ < body.size() && body[pos_] != '>'; ++pos_) {
            const char c = body[pos_];
            if (function ? !allowed_in_function_name(c) : !allowed_in_parameter_name(c)) {
              return BlockScan::malformed(tag_start_);
            }
          }
          if (pos_ == body.size()) return BlockScan::need_more();
          const std::string_view name = body.substr(name_start_, pos_ - name_start_);
          if (name.empty()) return BlockScan::malformed(tag_start_);
          ++pos_;  // '>'
          if (function) {
            function_name_ = name;
            arguments_ = Json::object();
            state_ = State::kInFunction;
          } else {
            parameter_name_ = name;
            value_start_ = search_from_ = pos_;
            state_ = State::kValue;
          }
          continue;
        }
        case State::kInFunction: {
          pos_ = skip_template_space(body, pos_);
          if (pos_ == body.size()) return BlockScan::need_more();
          const std::string_view rest = body.substr(pos_);
          const TagMatch param = match_tag_at_start(rest, kParameterOpen);
          if (param == TagMatch::kFull) {
            begin_tag(kParameterOpen, State::kParameterName);
            continue;
          }
          const TagMatch close = match_tag_at_start(rest, kFunctionClose);
          if (close == TagMatch::kFull) {
            calls_.push_back({std::move(function_name_), arguments_.dump(-1, ' ', false, Json::error_handler_t::replace)});
            pos_ += kFunctionClose.size();
            state_ = State::kAfterFunction;
            continue;
          }
          if (param == TagMatch::kPartial || close == TagMatch::kPartial) return BlockScan::need_more();
          return BlockScan::malformed(pos_);
        }
        case State::kValue:
          if (!find_value_end(body)) return BlockScan::need_more();
          state_ = State::kInFunction;
          continue;
      }
    }
  }

  void begin_tag(std::string_view tag, State next) {
    tag_start_ = pos_;
    pos_ += tag.size();
    name_start_ = pos_;
    state_ = next;
  }

  // Looks for the "</parameter>" that ends the current value (see the grammar above);
  // stores the typed value and returns true, or returns false to wait for more text.
  bool find_value_end(std::string_view body) {
    for (;;) {
      const std::size_t close = body.find(kParameterClose, search_from_);
      if (close == std::string_view::npos) {
        // A later match can only start in the last (tag size - 1) bytes.
        const std::size_t tail = kParameterClose.size() - 1;
        if (body.size() > tail) search_from_ = std::max(search_from_, body.size() - tail);
        return false;
      }
      const std::size_t next = skip_template_space(body, close + kParameterClose.size());
      if (next == body.size()) {
        search_from_ = close;
        return false;
      }
      const std::string_view rest = body.substr(next);
      const TagMatch param = match_tag_at_start(rest, kParameterOpen);
      const TagMatch end = match_tag_at_start(rest, kFunctionClose);
      if (param == TagMatch::kFull || end == TagMatch::kFull) {
        const std::string_view value = strip_one_newline(body.substr(value_start_, close - value_start_));
        arguments_[parameter_name_] = convert_param_value(value, schemas_.find(function_name_, parameter_name_));
        pos_ = close + kParameterClose.size();
        return true;
      }
      if (param == TagMatch::kPartial || end == TagMatch::kPartial) {
        search_from_ = close;
        return false;
      }
      search_from_ = close + 1;  // literal text inside the value
    }
  }

  const ToolSchemas& schemas_;
  State state_ = State::kBeforeFunction;
  std::size_t pos_ = 0;          // next body byte to read
  std::size_t tag_start_ = 0;    // where the current "<function=" / "<parameter=" began
  std::size_t name_start_ = 0;   // first byte of the name in that tag
  std::size_t value_start_ = 0;  // first byte of the current value
  std::size_t search_from_ = 0;  // where to look for the value's "</parameter>" next
  std::string function_name_;
  std::string parameter_name_;
  Json arguments_;
  std::vector<ParsedFunctionCall> calls_;
};

// Picks the body format of one block from its first non-space byte.
class AutoBlockScanner final : public BlockScanner {
 public:
  explicit AutoBlockScanner(const ToolSchemas& schemas) : schemas_(schemas) {}

  BlockScan scan(std::string_view body, bool at_end) override {
    if (!inner_) {
      const std::size_t first = skip_template_space(body, 0);
      if (first == body.size()) return at_end ? BlockScan::malformed(body.size()) : BlockScan::need_more();
      inner_ = body[first] == '{' ? make_hermes_block_scanner() : make_qwen3_xml_block_scanner(schemas_);
    }
    return inner_->scan(body, at_end);
  }

 private:
  const ToolSchemas& schemas_;
  std::unique_ptr<BlockScanner> inner_;
};

}  // namespace

std::unique_ptr<BlockScanner> make_qwen3_xml_block_scanner(const ToolSchemas& schemas) {
  return std::make_unique<Qwen3XmlBlockScanner>(schemas);
}

std::unique_ptr<BlockScanner> make_auto_block_scanner(const ToolSchemas& schemas) {
  return std::make_unique<AutoBlockScanner>(schemas);
}

}  // namespace moeserve::text
