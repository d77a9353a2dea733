#include "server/structured_output.h"

#include <fmt/format.h>

#include "core/error.h"
#include "server/api_error.h"
#include "structured/json_constraint.h"
#include "structured/json_schema_compiler.h"
#include "structured/token_mask.h"
#include "structured/token_vocabulary.h"
#include "text/tokenizer.h"

namespace moeserve::server {

namespace {
constexpr const char* kSchemaParam = "response_format.json_schema.schema";
}

ResponseFormat parse_response_format(const JsonFields& request) {
  ResponseFormat format;
  const auto* rf = request.object("response_format");
  if (!rf) return format;
  JsonFields fields(*rf, "response_format.");
  const std::string type = fields.required_string("type");
  if (type == "text") return format;
  if (type == "json_object") {
    format.type = ResponseFormat::Type::JsonObject;
    return format;
  }
  if (type != "json_schema")
    throw_bad_request(fmt::format("response_format type `{}` is not supported; use \"text\", \"json_object\" or "
                                  "\"json_schema\"",
                                  type),
                      "response_format.type");
  const auto* js = fields.object("json_schema");
  if (!js) throw_bad_request("response_format type `json_schema` needs a `json_schema` object", "response_format.json_schema");
  JsonFields schema_fields(*js, "response_format.json_schema.");
  (void)schema_fields.string("name");  // checked for its type; OpenAI's label, not used here
  (void)schema_fields.string("description");
  (void)schema_fields.boolean("strict");  // the grammar is always strict
  if (!js->contains("schema"))
    throw_bad_request("response_format.json_schema needs a `schema`", kSchemaParam);
  if (!(*js)["schema"].is_object() && !(*js)["schema"].is_boolean())
    throw_bad_request(fmt::format("`{}` must be a JSON Schema object, got {}", kSchemaParam,
                                  json_type_name((*js)["schema"])),
                      kSchemaParam);
  format.type = ResponseFormat::Type::JsonSchema;
  format.schema = nlohmann::ordered_json::parse((*js)["schema"].dump());
  return format;
}

nlohmann::ordered_json schema_in_request_order(const std::string& raw_body) {
  return nlohmann::ordered_json::parse(raw_body).at("response_format").at("json_schema").at("schema");
}

StructuredOutputs::StructuredOutputs(const text::Tokenizer& tokenizer, int64_t vocab_size, size_t max_grammars)
    : tokenizer_(tokenizer), vocab_size_(vocab_size), max_grammars_(max_grammars) {}

StructuredOutputs::~StructuredOutputs() = default;

const std::shared_ptr<const structured::TokenVocabulary>& StructuredOutputs::vocabulary() {
  std::call_once(vocabulary_once_,
                 [&] { vocabulary_ = structured::TokenVocabulary::from_tokenizer(tokenizer_, vocab_size_); });
  return vocabulary_;
}

std::shared_ptr<const runtime::TokenConstraintFactory> StructuredOutputs::factory(
    const ResponseFormat& format, std::optional<int32_t> start_after_token) {
  if (format.type == ResponseFormat::Type::Text) return nullptr;
  const std::string key = format.type == ResponseFormat::Type::JsonObject ? "json_object" : format.schema.dump();
  std::shared_ptr<const structured::TokenMasker> masker;
  {
    std::lock_guard lock(mutex_);
    if (auto it = maskers_.find(key); it != maskers_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      masker = it->second.first;
    }
  }
  if (!masker) {
    structured::JsonGrammar grammar;
    if (format.type == ResponseFormat::Type::JsonObject) {
      grammar = structured::any_json_object();
    } else {
      try {
        grammar = structured::compile_json_schema(format.schema);
      } catch (const Error& e) {
        throw_bad_request(fmt::format("Invalid `{}`: {}", kSchemaParam, e.what()), kSchemaParam);
      }
    }
    masker = std::make_shared<const structured::TokenMasker>(std::move(grammar), vocabulary());
    std::lock_guard lock(mutex_);
    if (!maskers_.count(key)) {
      while (maskers_.size() >= max_grammars_ && !lru_.empty()) {
        maskers_.erase(lru_.back());
        lru_.pop_back();
      }
      lru_.push_front(key);
      maskers_.emplace(key, std::make_pair(masker, lru_.begin()));
    }
  }
  return std::make_shared<const structured::JsonConstraintFactory>(std::move(masker), start_after_token);
}

}  // namespace moeserve::server
