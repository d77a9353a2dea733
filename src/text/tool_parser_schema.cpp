#include "text/tool_parser_schema.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

#include "core/error.h"
#include "text/tool_parser_python_literal.h"

namespace moeserve::text {
namespace {

using Json = nlohmann::ordered_json;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// A JSON-schema / vLLM type name to a kind (vLLM qwen3_coder's alias lists).
ParamKind kind_from_name(std::string_view raw) {
  const std::string t = lower(trim(raw));
  if (t == "string" || t == "str" || t == "text" || t == "varchar" || t == "char" || t == "enum") return ParamKind::kString;
  if (starts_with(t, "int") || starts_with(t, "uint") || starts_with(t, "long") || starts_with(t, "short") ||
      starts_with(t, "unsigned")) {
    return ParamKind::kInteger;
  }
  if (starts_with(t, "num") || starts_with(t, "float")) return ParamKind::kNumber;
  if (t == "boolean" || t == "bool" || t == "binary") return ParamKind::kBoolean;
  if (t == "null") return ParamKind::kNull;
  if (t == "object" || t == "array" || t == "arr" || starts_with(t, "dict") || starts_with(t, "list")) {
    return ParamKind::kContainer;
  }
  return ParamKind::kOther;
}

// The first non-null type of a list of type names, and whether null is among them.
void apply_type_names(const std::vector<std::string>& names, ParamType& out) {
  bool picked = false;
  for (const std::string& name : names) {
    const ParamKind kind = kind_from_name(name);
    if (kind == ParamKind::kNull) {
      out.nullable = true;
    } else if (!picked) {
      out.kind = kind;
      picked = true;
    }
  }
  if (!picked && out.nullable) out.kind = ParamKind::kNull;
}

bool is_null_word(std::string_view text) {
  const std::string t = lower(trim(text));
  return t == "null" || t == "none";
}

// Python int(): optional sign, digits with single underscores between them.
std::optional<Json> parse_integer(std::string_view text) {
  std::string_view s = trim(text);
  bool negative = false;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.front() == '_' || s.back() == '_') return std::nullopt;
  std::string digits;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && s[i - 1] != '_') continue;
    if (c < '0' || c > '9') return std::nullopt;
    digits += c;
  }
  errno = 0;
  const unsigned long long magnitude = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;  // wider than 64 bits: keep the text
  if (!negative) {
    if (magnitude <= static_cast<unsigned long long>(std::numeric_limits<std::int64_t>::max())) {
      return Json(static_cast<std::int64_t>(magnitude));
    }
    return Json(static_cast<std::uint64_t>(magnitude));
  }
  constexpr unsigned long long kMinMagnitude = 1ULL << 63;
  if (magnitude < kMinMagnitude) return Json(-static_cast<std::int64_t>(magnitude));
  if (magnitude == kMinMagnitude) return Json(std::numeric_limits<std::int64_t>::min());
  return std::nullopt;
}

// Python float() of finite decimal text; integral values become integers, as vLLM does
// ("3.0" -> 3).
std::optional<Json> parse_number(std::string_view text) {
  const std::string_view s = trim(text);
  if (s.empty()) return std::nullopt;
  std::string cleaned;
  bool any_digit = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      any_digit = true;
      cleaned += c;
    } else if (c == '_') {
      // only between digits
      if (i == 0 || i + 1 == s.size() || s[i - 1] < '0' || s[i - 1] > '9' || s[i + 1] < '0' || s[i + 1] > '9') {
        return std::nullopt;
      }
    } else if (c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E') {
      cleaned += c;
    } else {
      return std::nullopt;  // also rejects inf/nan: not representable in JSON
    }
  }
  if (!any_digit) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(cleaned.c_str(), &end);
  if (end != cleaned.c_str() + cleaned.size() || !std::isfinite(v)) return std::nullopt;
  if (v == std::trunc(v) && std::fabs(v) < 9.2e18) return Json(static_cast<std::int64_t>(v));
  return Json(v);
}

std::optional<Json> parse_json(std::string_view text) {
  Json v = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return std::nullopt;
  return v;
}

// object/array values: JSON first, then a Python literal. A JSON string holding a
// Python repr (a model trained on `json.dumps(str(dict))`) is read once more.
std::optional<Json> parse_container(std::string_view text) {
  std::optional<Json> v = parse_json(text);
  if (!v) v = parse_python_literal(text);
  if (v && v->is_string()) {
    if (std::optional<Json> inner = parse_python_literal(v->get_ref<const std::string&>())) v = std::move(inner);
  }
  return v;
}

}  // namespace

ParamType param_type_from_schema(const nlohmann::json& property) {
  ParamType out;
  if (!property.is_object()) return out;
  if (auto it = property.find("type"); it != property.end()) {
    std::vector<std::string> names;
    if (it->is_string()) {
      names.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& t : *it) {
        if (t.is_string()) names.push_back(t.get<std::string>());
      }
    }
    apply_type_names(names, out);
    return out;
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = property.find(key);
    if (it == property.end() || !it->is_array()) continue;
    std::vector<std::string> names;
    for (const auto& option : *it) {
      if (!option.is_object()) continue;
      auto t = option.find("type");
      if (t != option.end() && t->is_string()) names.push_back(t->get<std::string>());
    }
    out.kind = ParamKind::kString;
    apply_type_names(names, out);
    return out;
  }
  if (auto it = property.find("enum"); it != property.end() && it->is_array()) {
    bool all_strings = true;
    for (const auto& v : *it) {
      if (v.is_null()) {
        out.nullable = true;
      } else if (!v.is_string()) {
        all_strings = false;
      }
    }
    out.kind = all_strings ? ParamKind::kString : ParamKind::kOther;
  }
  return out;
}

ToolSchemas ToolSchemas::from_json(const nlohmann::json& tools) {
  ToolSchemas out;
  if (tools.is_null()) return out;
  MOESERVE_CHECK(tools.is_array(), "tools: expected an array of tool definitions, got {}", tools.type_name());
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::json& tool = tools[i];
    MOESERVE_CHECK(tool.is_object(), "tools[{}]: expected an object, got {}", i, tool.type_name());
    const nlohmann::json* function = &tool;
    if (auto it = tool.find("function"); it != tool.end()) {
      MOESERVE_CHECK(it->is_object(), "tools[{}].function: expected an object, got {}", i, it->type_name());
      function = &*it;
    }
    auto name = function->find("name");
    MOESERVE_CHECK(name != function->end() && name->is_string(), "tools[{}].function.name: expected a string", i);
    std::map<std::string, ParamType, std::less<>>& params = out.functions_[name->get<std::string>()];
    auto parameters = function->find("parameters");
    if (parameters == function->end() || parameters->is_null()) continue;
    MOESERVE_CHECK(parameters->is_object(), "tools[{}].function.parameters: expected an object, got {}", i,
                   parameters->type_name());
    auto properties = parameters->find("properties");
    if (properties == parameters->end() || properties->is_null()) continue;
    MOESERVE_CHECK(properties->is_object(), "tools[{}].function.parameters.properties: expected an object, got {}", i,
                   properties->type_name());
    for (const auto& [param, schema] : properties->items()) params[param] = param_type_from_schema(schema);
  }
  return out;
}

const ParamType* ToolSchemas::find(std::string_view function, std::string_view param) const {
  auto f = functions_.find(function);
  if (f == functions_.end()) return nullptr;
  auto p = f->second.find(param);
  return p == f->second.end() ? nullptr : &p->second;
}

nlohmann::ordered_json convert_param_value(std::string_view text, const ParamType* type) {
  const auto verbatim = [&] { return Json(std::string(text)); };
  if (type == nullptr) return verbatim();
  // A nullable schema maps "null" / Python's "None" to null, also for strings.
  if (type->nullable && is_null_word(text)) return Json(nullptr);
  if (type->kind == ParamKind::kString) return verbatim();
  // Every other type reads "null" / "None" as null (the Qwen3.5 template renders a None
  // argument with `| string`).
  if (is_null_word(text)) return Json(nullptr);
  std::optional<Json> v;
  switch (type->kind) {
    case ParamKind::kInteger: v = parse_integer(text); break;
    case ParamKind::kNumber: v = parse_number(text); break;
    case ParamKind::kBoolean: {
      const std::string t = lower(trim(text));
      if (t == "true") v = Json(true);
      if (t == "false") v = Json(false);
      break;
    }
    case ParamKind::kContainer: v = parse_container(text); break;
    case ParamKind::kOther: v = parse_python_literal(text); break;
    case ParamKind::kString:
    case ParamKind::kNull: break;
  }
  return v ? std::move(*v) : verbatim();
}

}  // namespace moeserve::text
