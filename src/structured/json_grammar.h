// The grammar of the JSON texts a structured-output request may produce: a graph of value
// nodes that json_matcher.h walks byte by byte. `response_format: {"type": "json_object"}`
// is any_json_object(); a JSON schema compiles into one (json_schema_compiler.h).
//
// A grammar accepts only JSON texts (RFC 8259) whose value matches its root node, with at most
// max_whitespace bytes of whitespace between tokens and none after the value; the one
// exception is literal_choice(), whose literals are plain texts. A grammar may accept fewer
// texts than its schema allows (object properties come in the schema's order, for example).
#pragma once
#include <cstdint>
#include <limits>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "structured/regex_dfa.h"

namespace moeserve::structured {

inline constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
// Whitespace bytes allowed in one gap between JSON tokens, by default: room for
// pretty-printing, but a model that keeps emitting spaces is made to go on with the value.
inline constexpr uint8_t kMaxWhitespace = 48;
// Nesting depth of the JSON value (objects and arrays inside each other).
inline constexpr int kMaxNesting = 48;
// Bounds of range-checked integers: the matcher tracks the value typed so far in 32 bits.
inline constexpr int64_t kMaxIntegerBound = 2147483647;
// Bounded (non-integer) numbers are written without exponent, with at most
// kDecimalFractionDigits fraction digits and an integer part below kDecimalIntegerLimit; their
// bounds are held in units of 10^-kDecimalFractionDigits.
inline constexpr int kDecimalFractionDigits = 6;
inline constexpr int64_t kDecimalUnit = 1000000;
inline constexpr int64_t kDecimalIntegerLimit = 1000000000;

enum class NodeKind : uint8_t {
  Any,      // any JSON value
  Object,   // properties in order, or a map (additional) when it has none
  Array,    // items, min_items..max_items of them
  String,   // min_length..max_length characters (code points; an escape is one)
  Number,   // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  Integer,  // -?(0|[1-9][0-9]*)
  Literal,  // exactly one JSON text, e.g. true, null, "red", {"a":1} (compact form)
  AnyOf,    // one of `options`
  Pattern,  // raw text that patterns[pattern] matches whole: vLLM's regex, or a large enum's JSON texts
};

struct JsonProperty {
  uint32_t key_literal = 0;  // literals[key_literal]: the key as a JSON string without its opening quote
  uint32_t value = 0;        // node of the value
  bool required = false;
};

struct JsonNode {
  NodeKind kind = NodeKind::Any;
  // Object. With properties, each may appear once, in this order (required ones must); with
  // none, any string keys map to `additional` values (-1: only {}).
  std::vector<JsonProperty> properties;
  int64_t additional = -1;
  // Array.
  uint32_t items = 0;
  uint32_t min_items = 0, max_items = kUnbounded;
  // String: length limits, or a pattern (patterns[pattern], searched in the decoded value).
  // Pattern: the whole text's.
  uint32_t min_length = 0, max_length = kUnbounded;
  int32_t pattern = -1;
  // Integer: inclusive bounds, when set (within +-kMaxIntegerBound). Number: the same in units
  // of 10^-kDecimalFractionDigits.
  bool has_range = false;
  int64_t min_value = 0, max_value = 0;
  // Literal.
  uint32_t literal = 0;
  // AnyOf.
  std::vector<uint32_t> options;
};

struct JsonGrammar {
  // Nodes 0..3 and literals 0..2 are the same in every grammar: what `Any` expands to.
  static constexpr uint32_t kAny = 0, kAnyObject = 1, kAnyArray = 2, kAnyString = 3;
  static constexpr uint32_t kTrue = 0, kFalse = 1, kNull = 2;

  std::vector<JsonNode> nodes;
  std::vector<std::string> literals;
  std::vector<RegexDfa> patterns;
  uint32_t root = kAny;
  // Whitespace bytes allowed in one gap between JSON tokens (0: compact JSON), and whether
  // they may come before the root value (JSON allows it; a choice of literal texts does not).
  uint8_t max_whitespace = kMaxWhitespace;
  bool leading_whitespace = true;

  JsonGrammar();  // the built-in nodes and literals, root Any
  uint32_t add_node(JsonNode node);
  uint32_t add_literal(std::string text);
};

// response_format {"type": "json_object"}: any JSON object.
JsonGrammar any_json_object();
// vLLM's structured_outputs {"choice": [...]}: exactly one of `texts` (plain text, not JSON).
JsonGrammar literal_choice(const std::vector<std::string>& texts);
// vLLM's structured_outputs {"regex": ...}: a plain text the regex matches whole. Throws
// moeserve::Error for what RegexDfa does not support.
JsonGrammar regex_text(std::string_view pattern);
// The bytes a JSON string's decoded value can hold (raw UTF-8 bytes and printable ASCII, and
// the control characters with short escapes: \b \t \n \f \r), for RegexDfa::compile.
const std::array<bool, 256>& json_string_bytes();

}  // namespace moeserve::structured
