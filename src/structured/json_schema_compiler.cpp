#include "structured/json_schema_compiler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve::structured {

namespace {

using ojson = nlohmann::ordered_json;

const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default", "examples", "format", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "discriminator", "$defs", "definitions", "strict",
};
// Keywords handled below; anything else that is not an annotation is refused.
const std::set<std::string, std::less<>> kHandled = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems",
    "maxItems", "minLength", "maxLength", "anyOf", "oneOf", "allOf", "$ref",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern",
};
// Enums with more values than this become one automaton (the matcher keeps at most 256 ways
// to read a prefix).
constexpr size_t kLargeEnum = 16;
const char* const kNumericBounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

std::string escape_pointer_token(const std::string& token) {
  std::string out;
  for (char c : token) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

class Compiler {
 public:
  explicit Compiler(const ojson& root) : root_(root) {}

  JsonGrammar run() {
    g_.root = compile(root_, "");
    return std::move(g_);
  }

 private:
  [[noreturn]] void error(const std::string& path, const std::string& what) const {
    throw Error(fmt::format("{}: {}", path.empty() ? "(root)" : path, what));
  }

  uint32_t compile(const ojson& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return JsonGrammar::kAny;
      error(path, "the schema `false` accepts no value");
    }
    if (!s.is_object()) error(path, fmt::format("a schema must be an object or a boolean, got {}", s.type_name()));
    bool has_constraint = false;
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key)) continue;
      if (!kHandled.count(key))
        error(path, fmt::format("the keyword `{}` is not supported by structured output", key));
      has_constraint = true;
    }
    if (!has_constraint) return JsonGrammar::kAny;

    auto only = [&](const char* keyword) {
      for (const auto& [key, value] : s.items())
        if (key != keyword && !kAnnotations.count(key))
          error(path, fmt::format("`{}` together with `{}` is not supported", keyword, key));
    };
    if (s.contains("$ref")) {
      only("$ref");
      return compile_ref(s["$ref"], path + "/$ref");
    }
    if (s.contains("allOf")) {
      only("allOf");
      const ojson& all = s["allOf"];
      if (!all.is_array() || all.size() != 1)
        error(path + "/allOf", "only an allOf of exactly one schema is supported");
      return compile(all[0], path + "/allOf/0");
    }
    for (const char* keyword : {"anyOf", "oneOf"}) {
      if (!s.contains(keyword)) continue;
      only(keyword);
      const ojson& list = s[keyword];
      const std::string at = path + "/" + keyword;
      if (!list.is_array() || list.empty()) error(at, "must be a non-empty array of schemas");
      JsonNode node;
      node.kind = NodeKind::AnyOf;
      for (size_t i = 0; i < list.size(); ++i) add_option(node, compile(list[i], fmt::format("{}/{}", at, i)));
      return g_.add_node(std::move(node));
    }
    if (s.contains("enum") || s.contains("const")) return compile_literals(s, path);

    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& item : t) {
          if (!item.is_string()) error(path + "/type", "must be a string or an array of strings");
          types.push_back(item.get<std::string>());
        }
      } else {
        error(path + "/type", "must be a string or a non-empty array of strings");
      }
    } else {
      types.push_back(infer_type(s));
    }
    if (types.size() == 1) return compile_type(s, types[0], path);
    JsonNode node;
    node.kind = NodeKind::AnyOf;
    for (const auto& t : types) add_option(node, compile_type(s, t, path));
    return g_.add_node(std::move(node));
  }

  void add_option(JsonNode& any_of, uint32_t option) {
    // Nested anyOf flattens; the matcher forks once per option either way.
    if (g_.nodes[option].kind == NodeKind::AnyOf && !pending_.count(option)) {
      for (uint32_t o : g_.nodes[option].options) any_of.options.push_back(o);
    } else {
      any_of.options.push_back(option);
    }
  }

  std::string infer_type(const ojson& s) const {
    for (const char* k : {"properties", "required", "additionalProperties"})
      if (s.contains(k)) return "object";
    for (const char* k : {"items", "minItems", "maxItems"})
      if (s.contains(k)) return "array";
    for (const char* k : {"minLength", "maxLength"})
      if (s.contains(k)) return "string";
    return "any";
  }

  uint32_t count_keyword(const ojson& s, const char* keyword, const std::string& path, uint32_t fallback) const {
    if (!s.contains(keyword)) return fallback;
    const ojson& v = s[keyword];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= int64_t(kUnbounded))
      error(path + "/" + keyword, "must be a non-negative integer");
    return uint32_t(v.get<int64_t>());
  }

  uint32_t compile_type(const ojson& s, const std::string& type, const std::string& path) {
    JsonNode node;
    if (type == "null") return literal_node(JsonGrammar::kNull);
    if (type == "boolean") {
      node.kind = NodeKind::AnyOf;
      node.options = {literal_node(JsonGrammar::kTrue), literal_node(JsonGrammar::kFalse)};
      return g_.add_node(std::move(node));
    }
    if (type == "integer") {
      node.kind = NodeKind::Integer;
      set_integer_range(s, path, node);
      return g_.add_node(std::move(node));
    }
    if (type == "number") {
      node.kind = NodeKind::Number;
      set_decimal_range(s, path, node);
      return g_.add_node(std::move(node));
    }
    if (type == "any") {
      for (const char* k : kNumericBounds)
        if (s.contains(k)) error(path, fmt::format("`{}` needs \"type\": \"integer\" or \"number\"", k));
      if (s.contains("pattern")) error(path, "`pattern` is supported for \"type\": \"string\" only");
      return JsonGrammar::kAny;
    }
    if (type == "string") {
      node.kind = NodeKind::String;
      node.min_length = count_keyword(s, "minLength", path, 0);
      node.max_length = count_keyword(s, "maxLength", path, kUnbounded);
      if (node.min_length > node.max_length) error(path, "minLength is larger than maxLength");
      if (s.contains("pattern")) {
        if (s.contains("minLength") || s.contains("maxLength"))
          error(path, "`pattern` together with minLength / maxLength is not supported; put the length in the pattern");
        node.pattern = int32_t(g_.patterns.size());
        g_.patterns.push_back(compile_pattern(s["pattern"], path + "/pattern"));
      }
      return g_.add_node(std::move(node));
    }
    if (type == "array") {
      node.kind = NodeKind::Array;
      node.min_items = count_keyword(s, "minItems", path, 0);
      node.max_items = count_keyword(s, "maxItems", path, kUnbounded);
      if (node.min_items > node.max_items) error(path, "minItems is larger than maxItems");
      const uint32_t id = g_.add_node(std::move(node));
      uint32_t items = JsonGrammar::kAny;
      if (s.contains("items")) {
        const ojson& it = s["items"];
        if (it.is_boolean() && !it.get<bool>()) {
          if (g_.nodes[id].min_items > 0) error(path, "minItems > 0 with `items: false` accepts no array");
          g_.nodes[id].max_items = 0;
        } else {
          items = compile_child(it, path + "/items");
        }
      }
      g_.nodes[id].items = items;
      return id;
    }
    if (type == "object") return compile_object(s, path);
    error(path + "/type", fmt::format("unknown type `{}`", type));
  }

  // minimum / maximum / exclusiveMinimum / exclusiveMaximum as an inclusive range on a grid:
  // `scale` grid units per 1 (1 for integers, kDecimalUnit for bounded numbers), bounds pulled
  // in to +-`limit` units (the texts stay valid, and fewer). False when none is set.
  bool read_bounds(const ojson& s, const std::string& path, double scale, double limit, int64_t* min_units,
                   int64_t* max_units) const {
    double lo = -limit, hi = limit;
    bool any = false;
    for (const char* k : kNumericBounds) {
      if (!s.contains(k)) continue;
      const ojson& v = s[k];
      if (!v.is_number())
        error(path + "/" + k, v.is_boolean() ? "the draft-04 boolean form is not supported; give the bound as a number"
                                               : "must be a number");
      double u = v.get<double>() * scale;
      // 0.1 * 1e6 is 100000.00000000001: snap what is only the product's rounding error.
      if (scale != 1 && std::abs(u - std::round(u)) <= 4e-16 * std::abs(u)) u = std::round(u);
      const std::string key = k;
      if (key == "minimum") lo = std::max(lo, std::ceil(u));
      else if (key == "exclusiveMinimum") lo = std::max(lo, std::floor(u) + 1);
      else if (key == "maximum") hi = std::min(hi, std::floor(u));
      else hi = std::min(hi, std::ceil(u) - 1);
      any = true;
    }
    *min_units = int64_t(lo);
    *max_units = int64_t(hi);
    return any;
  }

  void set_integer_range(const ojson& s, const std::string& path, JsonNode& node) const {
    node.has_range =
        read_bounds(s, path, 1, double(kMaxIntegerBound), &node.min_value, &node.max_value);
    if (node.has_range && node.min_value > node.max_value)
      error(path, fmt::format("no integer in [{}, {}] satisfies the bounds (within +-{})", node.min_value,
                              node.max_value, kMaxIntegerBound));
  }

  // Bounded numbers are written with at most kDecimalFractionDigits fraction digits, no
  // exponent, and an integer part below kDecimalIntegerLimit; bounds in units of their grid.
  void set_decimal_range(const ojson& s, const std::string& path, JsonNode& node) const {
    node.has_range = read_bounds(s, path, double(kDecimalUnit), double(kDecimalIntegerLimit * kDecimalUnit - 1),
                                 &node.min_value, &node.max_value);
    if (node.has_range && node.min_value > node.max_value)
      error(path,
            fmt::format("no number with at most {} fraction digits satisfies the bounds", kDecimalFractionDigits));
  }

  uint32_t compile_object(const ojson& s, const std::string& path) {
    const uint32_t id = g_.add_node(JsonNode{});
    g_.nodes[id].kind = NodeKind::Object;
    std::set<std::string> required;
    if (s.contains("required")) {
      const ojson& r = s["required"];
      if (!r.is_array()) error(path + "/required", "must be an array of property names");
      for (const auto& name : r) {
        if (!name.is_string()) error(path + "/required", "must be an array of property names");
        required.insert(name.get<std::string>());
      }
    }
    std::vector<JsonProperty> props;
    std::set<std::string> seen;
    if (s.contains("properties")) {
      const ojson& p = s["properties"];
      if (!p.is_object()) error(path + "/properties", "must be an object");
      for (const auto& [name, sub] : p.items()) {
        const std::string at = path + "/properties/" + escape_pointer_token(name);
        JsonProperty prop;
        const std::string quoted = ojson(name).dump();
        prop.key_literal = g_.add_literal(quoted.substr(1));  // the opening quote is read by the object
        prop.value = compile_child(sub, at);
        prop.required = required.count(name) > 0;
        props.push_back(prop);
        seen.insert(name);
      }
    }
    for (const auto& name : required)
      if (!seen.count(name))
        error(path + "/required",
              fmt::format("required property `{}` is not in `properties`; structured output generates only "
                          "listed properties",
                          name));
    int64_t additional = JsonGrammar::kAny;
    if (s.contains("additionalProperties")) {
      const ojson& a = s["additionalProperties"];
      if (a.is_boolean()) additional = a.get<bool>() ? int64_t(JsonGrammar::kAny) : -1;
      else if (props.empty()) additional = compile_child(a, path + "/additionalProperties");
    }
    JsonNode& node = g_.nodes[id];
    node.properties = std::move(props);
    node.additional = node.properties.empty() ? additional : -1;
    return id;
  }

  // A schema below an object or array: reaching a $ref being compiled from here is recursion
  // through a container, which is fine.
  uint32_t compile_child(const ojson& s, const std::string& path) {
    std::set<std::string> saved;
    saved.swap(direct_refs_);
    const uint32_t id = compile(s, path);
    direct_refs_.swap(saved);
    return id;
  }

  uint32_t literal_node(uint32_t literal) {
    JsonNode node;
    node.kind = NodeKind::Literal;
    node.literal = literal;
    return g_.add_node(std::move(node));
  }

  static bool value_has_type(const ojson& v, const std::string& type) {
    if (type == "null") return v.is_null();
    if (type == "boolean") return v.is_boolean();
    if (type == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (type == "number") return v.is_number();
    if (type == "string") return v.is_string();
    if (type == "array") return v.is_array();
    if (type == "object") return v.is_object();
    return false;
  }

  RegexDfa compile_pattern(const ojson& pattern, const std::string& path) const {
    if (!pattern.is_string()) error(path, "must be a string");
    try {
      return RegexDfa::compile(pattern.get<std::string>(), RegexDfa::Match::Search, json_string_bytes());
    } catch (const Error& e) {
      error(path, e.what());
    }
  }

  // A number against the schema's minimum / maximum / exclusive bounds (JSON Schema semantics).
  static bool within_bounds(const ojson& s, double x) {
    auto bound = [&](const char* k) {
      return s.contains(k) && s[k].is_number() ? std::optional(s[k].get<double>()) : std::nullopt;
    };
    if (auto b = bound("minimum"); b && x < *b) return false;
    if (auto b = bound("maximum"); b && x > *b) return false;
    if (auto b = bound("exclusiveMinimum"); b && x <= *b) return false;
    if (auto b = bound("exclusiveMaximum"); b && x >= *b) return false;
    return true;
  }

  uint32_t compile_literals(const ojson& s, const std::string& path) {
    std::vector<ojson> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      const ojson& e = s["enum"];
      if (!e.is_array() || e.empty()) error(path + "/enum", "must be a non-empty array");
      if (s.contains("const")) {
        // Both: the const, if the enum has it.
        if (std::find(e.begin(), e.end(), values[0]) == e.end()) error(path, "`const` is not one of `enum`");
      } else {
        values.assign(e.begin(), e.end());
      }
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array())
        for (const auto& x : t)
          if (x.is_string()) types.push_back(x.get<std::string>());
    }
    JsonNode any_of;
    any_of.kind = NodeKind::AnyOf;
    for (const ojson& v : values) {
      if (!types.empty() &&
          std::none_of(types.begin(), types.end(), [&](const std::string& t) { return value_has_type(v, t); }))
        continue;
      if (v.is_number() && !within_bounds(s, v.get<double>())) continue;
      if (v.is_string() && s.contains("pattern") &&
          !compile_pattern(s["pattern"], path + "/pattern").matches(v.get_ref<const std::string&>()))
        continue;
      if (v.is_string()) {
        const auto& str = v.get_ref<const std::string&>();
        const auto chars =
            size_t(std::count_if(str.begin(), str.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
        if (chars < count_keyword(s, "minLength", path, 0) || chars > count_keyword(s, "maxLength", path, kUnbounded))
          continue;
      }
      any_of.options.push_back(literal_node(g_.add_literal(v.dump())));
    }
    if (any_of.options.empty()) error(path, "no value of `enum`/`const` matches the schema's other keywords");
    if (any_of.options.size() > kLargeEnum) {
      // Many values: one automaton over their texts, rather than a fork per value.
      std::vector<std::string> texts;
      for (uint32_t option : any_of.options) texts.push_back(g_.literals[g_.nodes[option].literal]);
      JsonNode node;
      node.kind = NodeKind::Pattern;
      node.pattern = int32_t(g_.patterns.size());
      g_.patterns.push_back(RegexDfa::from_literals(texts));
      return g_.add_node(std::move(node));
    }
    if (any_of.options.size() == 1) return any_of.options[0];
    return g_.add_node(std::move(any_of));
  }

  uint32_t compile_ref(const ojson& ref, const std::string& path) {
    if (!ref.is_string()) error(path, "must be a string");
    const std::string target = ref.get<std::string>();
    if (target.empty() || target[0] != '#')
      error(path, fmt::format("`{}`: only references inside the schema (\"#...\") are supported", target));
    if (auto it = refs_.find(target); it != refs_.end()) {
      if (direct_refs_.count(target))
        error(path, fmt::format("`{}` refers to itself without an object or array in between", target));
      return it->second;
    }
    const ojson* node = &root_;
    const std::string pointer = target.substr(1);
    if (!pointer.empty()) {
      try {
        node = &root_.at(ojson::json_pointer(pointer));
      } catch (const std::exception&) {
        error(path, fmt::format("`{}` does not name a schema in this document", target));
      }
    }
    // Reserve the node first so that recursive references find it.
    const uint32_t id = g_.add_node(JsonNode{});
    refs_[target] = id;
    pending_.insert(id);
    direct_refs_.insert(target);
    const uint32_t body = compile(*node, pointer);
    direct_refs_.erase(target);
    pending_.erase(id);
    g_.nodes[id] = g_.nodes[body];
    return id;
  }

  const ojson& root_;
  JsonGrammar g_;
  std::map<std::string, uint32_t> refs_;   // "$ref" target -> its node
  std::set<std::string> direct_refs_;      // targets being compiled with no container in between
  std::set<uint32_t> pending_;             // reserved nodes not yet filled in
};

}  // namespace

JsonGrammar compile_json_schema(const nlohmann::ordered_json& schema) { return Compiler(schema).run(); }

}  // namespace moeserve::structured
