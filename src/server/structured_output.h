// Structured output for chat and completions, as OpenAI's response_format:
//   {"type": "text"}                      no constraint
//   {"type": "json_object"}               any JSON object
//   {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
//                                         a JSON value matching the schema (what the grammar
//                                         supports: src/structured/json_schema_compiler.h)
// or as vLLM's structured_outputs (one of):
//   {"json": SCHEMA or its JSON text}     as json_schema
//   {"json_object": true}                 as json_object
//   {"choice": ["a", "b", ...]}           exactly one of the texts
//   {"regex": "..."}                      a text the regex matches whole (RegexDfa's syntax)
// (grammar and structural_tag are refused with a 400).
// The request is checked when it is parsed (parse_response_format: 400 naming the field);
// the schema is compiled, and its masks cached, by StructuredOutputs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/lru_cache.h"
#include "runtime/token_constraint.h"
#include "server/json_fields.h"

namespace moeserve::text {
class Tokenizer;
}
namespace moeserve::structured {
class TokenMasker;
class TokenVocabulary;
}  // namespace moeserve::structured

namespace moeserve::server {

struct ResponseFormat {
  enum class Type { Text, JsonObject, JsonSchema, Choice, Regex };
  Type type = Type::Text;
  // JsonSchema: the schema, with its object keys in the request's order (properties are
  // generated in that order); where the request holds it (a JSON pointer), and its name in
  // errors.
  nlohmann::ordered_json schema;
  std::string schema_pointer;
  std::string schema_param;
  std::vector<std::string> choices;  // Choice
  std::string regex;                 // Regex
};

// The request's response_format or structured_outputs (Text when neither). Throws
// ApiError(400). The schema's keys come out sorted (nlohmann::json): see
// schema_in_request_order.
ResponseFormat parse_response_format(const JsonFields& request);
// The schema of `format` (JsonSchema, as parse_response_format returned it for this body),
// read again from the body as sent, with its keys in the request's order.
nlohmann::ordered_json schema_in_request_order(const std::string& raw_body, const ResponseFormat& format);

// One per server: the vocabulary as bytes (built on first use) and the compiled grammars of
// recent formats, whose mask caches requests with the same schema share.
class StructuredOutputs {
 public:
  // At most max_grammars grammars, each caching up to 256 masks (TokenMasker): ~125 MB of
  // masks at most for Qwen3.5's vocabulary.
  // `max_whitespace`: the whitespace bytes allowed between JSON tokens (0: compact JSON).
  StructuredOutputs(const text::Tokenizer& tokenizer, int64_t vocab_size, uint8_t max_whitespace,
                    size_t max_grammars = 16);
  ~StructuredOutputs();

  // The constraint factory of `format` (nullptr for Text), parsed from `raw_body` (whose
  // schema is read again in request order). `start_after_token`: the grammar applies only
  // after this token (the reasoning parser's </think>). Throws ApiError(400) for a schema the
  // grammar cannot express. Thread-safe.
  std::shared_ptr<const runtime::TokenConstraintFactory> factory(const ResponseFormat& format,
                                                                 const std::string& raw_body,
                                                                 std::optional<int32_t> start_after_token);

 private:
  const std::shared_ptr<const structured::TokenVocabulary>& vocabulary();

  const text::Tokenizer& tokenizer_;
  const int64_t vocab_size_;
  const uint8_t max_whitespace_;
  std::once_flag vocabulary_once_;
  std::shared_ptr<const structured::TokenVocabulary> vocabulary_;

  std::mutex mutex_;
  LruCache<std::string, std::shared_ptr<const structured::TokenMasker>> maskers_;  // by format
};

}  // namespace moeserve::server
