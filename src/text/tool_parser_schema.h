// The request's `tools` as the tool-call parsers need them: for each function, the JSON
// type of each parameter, used to type XML-style argument values (qwen3_coder format,
// where every value arrives as text).
#pragma once
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moeserve::text {

// How a parameter's text is turned into a JSON value. Type names follow the aliases
// vLLM's qwen3_coder parser accepts (e.g. "int32", "float", "bool", "dict", "list").
enum class ParamKind {
  kString,     // kept verbatim
  kInteger,    // "integer", "int*", "uint*", "long*", "short*", "unsigned*"
  kNumber,     // "number", "num*", "float*"
  kBoolean,    // "boolean", "bool", "binary"
  kNull,       // "null"
  kContainer,  // "object", "array", "arr", "dict*", "list*"
  kOther,      // any other type name: JSON, then Python literal, then the text itself
};

struct ParamType {
  ParamKind kind = ParamKind::kString;
  bool nullable = false;  // the schema admits null ("null" in a type list or anyOf/oneOf)
};

class ToolSchemas {
 public:
  ToolSchemas() = default;

  // `tools` is the request's array: [{"type": "function", "function": {"name": ...,
  // "parameters": {"type": "object", "properties": {...}}}}, ...]; entries without the
  // "function" wrapper ({"name", "parameters"}) are accepted too. null means no tools.
  // Throws moeserve::Error naming the offending entry when the shape is wrong.
  static ToolSchemas from_json(const nlohmann::json& tools);

  // The type of `param` of `function`; nullptr when either is unknown (the value then
  // stays a string).
  const ParamType* find(std::string_view function, std::string_view param) const;

 private:
  std::map<std::string, std::map<std::string, ParamType, std::less<>>, std::less<>> functions_;
};

// The type a JSON-schema property describes ("type" as a string or a list, "anyOf",
// "oneOf", "enum"); a property with none of them is a string, as in vLLM.
ParamType param_type_from_schema(const nlohmann::json& property);

// Converts one parameter's text (already stripped of the format's newlines) to a JSON
// value by its declared type; `type` nullptr means undeclared (string). Text that does
// not parse as the declared type stays a string: a value is never invented or dropped.
nlohmann::ordered_json convert_param_value(std::string_view text, const ParamType* type);

}  // namespace moeserve::text
