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

// A schema given as a JSON object or boolean, or (vLLM's structured_outputs.json) as the
// text of one.
nlohmann::ordered_json schema_value(const nlohmann::json& value, const std::string& param) {
  if (value.is_object() || value.is_boolean()) return nlohmann::ordered_json::parse(value.dump());
  if (value.is_string()) {
    try {
      auto parsed = nlohmann::ordered_json::parse(value.get<std::string>());
      if (parsed.is_object() || parsed.is_boolean()) return parsed;
    } catch (const nlohmann::json::exception&) {
    }
    throw_bad_request(fmt::format("`{}` is a string that is not a JSON Schema object", param), param);
  }
  throw_bad_request(fmt::format("`{}` must be a JSON Schema object, got {}", param, json_type_name(value)), param);
}

ResponseFormat parse_openai_format(const nlohmann::json& rf) {
  ResponseFormat format;
  JsonFields fields(rf, "response_format.");
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
  if (!js)
    throw_bad_request("response_format type `json_schema` needs a `json_schema` object", "response_format.json_schema");
  JsonFields schema_fields(*js, "response_format.json_schema.");
  (void)schema_fields.string("name");  // checked for its type; OpenAI's label, not used here
  (void)schema_fields.string("description");
  (void)schema_fields.boolean("strict");  // the grammar is always strict
  format.schema_param = "response_format.json_schema.schema";
  format.schema_pointer = "/response_format/json_schema/schema";
  if (!js->contains("schema")) throw_bad_request("response_format.json_schema needs a `schema`", format.schema_param);
  const auto& schema = (*js)["schema"];
  if (!schema.is_object() && !schema.is_boolean())
    throw_bad_request(
        fmt::format("`{}` must be a JSON Schema object, got {}", format.schema_param, json_type_name(schema)),
        format.schema_param);
  format.type = ResponseFormat::Type::JsonSchema;
  format.schema = schema_value(schema, format.schema_param);
  return format;
}

ResponseFormat parse_vllm_format(const nlohmann::json& so) {
  ResponseFormat format;
  JsonFields fields(so, "structured_outputs.");
  for (const char* refused : {"grammar", "structural_tag", "whitespace_pattern"})
    if (fields.has(refused))
      throw_bad_request(
          fmt::format("`structured_outputs.{}` is not supported; use `json`, `json_object`, `choice` or `regex`",
                      refused),
          fmt::format("structured_outputs.{}", refused));
  int given = 0;
  if (fields.has("json")) {
    ++given;
    format.type = ResponseFormat::Type::JsonSchema;
    format.schema_param = "structured_outputs.json";
    format.schema_pointer = "/structured_outputs/json";
    format.schema = schema_value(so["json"], format.schema_param);
  }
  if (auto v = fields.boolean("json_object"); v && *v) {
    ++given;
    format.type = ResponseFormat::Type::JsonObject;
  }
  if (const auto* choice = fields.array("choice")) {
    ++given;
    format.type = ResponseFormat::Type::Choice;
    if (choice->empty())
      throw_bad_request("`structured_outputs.choice` must not be empty", "structured_outputs.choice");
    for (const auto& c : *choice) {
      if (!c.is_string() || c.get_ref<const std::string&>().empty())
        throw_bad_request("`structured_outputs.choice` must be a list of non-empty strings",
                          "structured_outputs.choice");
      format.choices.push_back(c.get<std::string>());
    }
  }
  if (auto regex = fields.string("regex")) {
    ++given;
    format.type = ResponseFormat::Type::Regex;
    format.regex = *regex;
  }
  if (given > 1)
    throw_bad_request("give one of `structured_outputs.json`, `json_object`, `choice` and `regex`",
                      "structured_outputs");
  return format;
}

}  // namespace

ResponseFormat parse_response_format(const JsonFields& request) {
  ResponseFormat format;
  if (const auto* rf = request.object("response_format")) format = parse_openai_format(*rf);
  if (const auto* so = request.object("structured_outputs")) {
    if (format.type != ResponseFormat::Type::Text)
      throw_bad_request("give `response_format` or `structured_outputs`, not both", "structured_outputs");
    format = parse_vllm_format(*so);
  }
  return format;
}

nlohmann::ordered_json schema_in_request_order(const std::string& raw_body, const ResponseFormat& format) {
  const auto value =
      nlohmann::ordered_json::parse(raw_body).at(nlohmann::ordered_json::json_pointer(format.schema_pointer));
  return value.is_string() ? nlohmann::ordered_json::parse(value.get<std::string>()) : value;
}

StructuredOutputs::StructuredOutputs(const text::Tokenizer& tokenizer, int64_t vocab_size, uint8_t max_whitespace,
                                     size_t max_grammars)
    : tokenizer_(tokenizer), vocab_size_(vocab_size), max_whitespace_(max_whitespace), maskers_(max_grammars) {}

StructuredOutputs::~StructuredOutputs() = default;

const std::shared_ptr<const structured::TokenVocabulary>& StructuredOutputs::vocabulary() {
  std::call_once(vocabulary_once_,
                 [&] { vocabulary_ = structured::TokenVocabulary::from_tokenizer(tokenizer_, vocab_size_); });
  return vocabulary_;
}

std::shared_ptr<const runtime::TokenConstraintFactory> StructuredOutputs::factory(
    const ResponseFormat& request_format, const std::string& raw_body, std::optional<int32_t> start_after_token) {
  if (request_format.type == ResponseFormat::Type::Text) return nullptr;
  ResponseFormat format = request_format;
  if (format.type == ResponseFormat::Type::JsonSchema) format.schema = schema_in_request_order(raw_body, format);
  std::string key;
  switch (format.type) {
    case ResponseFormat::Type::JsonObject: key = "json_object"; break;
    case ResponseFormat::Type::Choice: key = "choice" + nlohmann::json(format.choices).dump(); break;
    case ResponseFormat::Type::Regex: key = "regex" + format.regex; break;
    default: key = "schema" + format.schema.dump(); break;
  }
  std::shared_ptr<const structured::TokenMasker> masker;
  {
    std::lock_guard lock(mutex_);
    if (auto hit = maskers_.get(key)) masker = *hit;
  }
  if (!masker) {
    structured::JsonGrammar grammar;
    if (format.type == ResponseFormat::Type::JsonObject) {
      grammar = structured::any_json_object();
    } else if (format.type == ResponseFormat::Type::Choice) {
      grammar = structured::literal_choice(format.choices);
    } else if (format.type == ResponseFormat::Type::Regex) {
      try {
        grammar = structured::regex_text(format.regex);
      } catch (const Error& e) {
        throw_bad_request(fmt::format("Invalid `structured_outputs.regex`: {}", e.what()), "structured_outputs.regex");
      }
    } else {
      try {
        grammar = structured::compile_json_schema(format.schema);
      } catch (const Error& e) {
        throw_bad_request(fmt::format("Invalid `{}`: {}", format.schema_param, e.what()), format.schema_param);
      }
    }
    if (format.type != ResponseFormat::Type::Choice && format.type != ResponseFormat::Type::Regex)
      grammar.max_whitespace = max_whitespace_;
    masker = std::make_shared<const structured::TokenMasker>(std::move(grammar), vocabulary());
    std::lock_guard lock(mutex_);
    maskers_.put(key, masker);
  }
  return std::make_shared<const structured::JsonConstraintFactory>(std::move(masker), start_after_token);
}

}  // namespace moeserve::server
