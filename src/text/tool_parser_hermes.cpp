// Hermes-style tool-call blocks (Qwen2.5, Qwen3). The Qwen3 chat template renders a past
// call as
//   <tool_call>\n{"name": "NAME", "arguments": ARGS_AS_JSON}\n</tool_call>
// (third_party/tokenizers/qwen3/tokenizer_config.json). The body is one JSON object; its
// end is found by tracking brackets outside JSON strings, so a "</tool_call>" inside a
// string argument does not end the block.
#include <optional>

#include <nlohmann/json.hpp>

#include "text/parser_tags.h"
#include "text/tool_parser_format.h"

namespace moeserve::text {
namespace {

using Json = nlohmann::ordered_json;

std::string dump_compact(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// The call in a complete JSON body, or nothing when it is not {"name": string,
// "arguments": object | JSON-object string | null | absent}.
std::optional<ParsedFunctionCall> read_call(std::string_view json_text) {
  const Json body = Json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return std::nullopt;  // also a discarded (invalid) parse
  auto name = body.find("name");
  if (name == body.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  ParsedFunctionCall call{name->get<std::string>(), "{}"};
  auto args = body.find("arguments");
  if (args == body.end() || args->is_null()) return call;
  if (args->is_object()) {
    call.arguments = dump_compact(*args);
    return call;
  }
  if (args->is_string()) {  // arguments already serialised once
    const std::string& text = args->get_ref<const std::string&>();
    const Json inner = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (inner.is_object()) {
      call.arguments = dump_compact(inner);
      return call;
    }
  }
  return std::nullopt;
}

class HermesBlockScanner final : public BlockScanner {
 public:
  BlockScan scan(std::string_view body, bool at_end) override {
    BlockScan result = step(body);
    if (result.status == BlockScan::Status::kNeedMore && at_end) return BlockScan::malformed(body.size());
    return result;
  }

 private:
  enum class State { kBeforeJson, kInJson, kAfterJson };

  BlockScan step(std::string_view body) {
    for (;;) {
      switch (state_) {
        case State::kBeforeJson:
          pos_ = skip_template_space(body, pos_);
          if (pos_ == body.size()) return BlockScan::need_more();
          if (body[pos_] != '{') return BlockScan::malformed(pos_);
          json_start_ = pos_;
          state_ = State::kInJson;
          continue;
        case State::kInJson:
          if (!scan_json(body)) return BlockScan::need_more();
          state_ = State::kAfterJson;
          continue;
        case State::kAfterJson: {
          pos_ = skip_template_space(body, pos_);
          const TagMatch close = match_tag_at_start(body.substr(pos_), kToolCallClose);
          if (close == TagMatch::kNone) return BlockScan::malformed(pos_);
          if (close == TagMatch::kPartial) return BlockScan::need_more();
          const std::size_t end = pos_ + kToolCallClose.size();
          std::optional<ParsedFunctionCall> call = read_call(body.substr(json_start_, json_end_ - json_start_));
          if (!call) return BlockScan::malformed(end);
          return {BlockScan::Status::kComplete, end, {std::move(*call)}};
        }
      }
    }
  }

  // Advances through the JSON value starting at json_start_; true once its closing
  // bracket is found (json_end_ set).
  bool scan_json(std::string_view body) {
    for (; pos_ < body.size(); ++pos_) {
      const char c = body[pos_];
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if (c == '}' || c == ']') {
        if (--depth_ == 0) {
          json_end_ = ++pos_;
          return true;
        }
      }
    }
    return false;
  }

  State state_ = State::kBeforeJson;
  std::size_t pos_ = 0;
  std::size_t json_start_ = 0;
  std::size_t json_end_ = 0;
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

}  // namespace

std::unique_ptr<BlockScanner> make_hermes_block_scanner() { return std::make_unique<HermesBlockScanner>(); }

}  // namespace moeserve::text
