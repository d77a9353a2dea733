// The filter table, and the filters on single values: default, length, numbers, tojson.
#include "text/jinja/filters.h"

#include <cmath>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/filters_impl.h"
#include "text/jinja/json_dump.h"
#include "text/jinja/methods.h"
#include "text/jinja/operators.h"
#include "text/jinja/py_number.h"
#include "text/jinja/py_string.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {
namespace filters {

Value soft_str(const Value& v) {
  if (v.is_string()) return v;
  return Value::string(to_str(v));
}

std::function<Value(const Value&)> make_attrgetter(const std::optional<Value>& attribute, bool ignore_case,
                                                   std::optional<Value> default_value) {
  std::vector<Value> parts;
  if (attribute && !attribute->is_none()) {
    if (attribute->is_string()) {
      for (const auto& part : py::split(attribute->as_string(), std::string("."), -1)) {
        bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
        parts.push_back(digits ? Value::integer(std::stoll(part)) : Value::string(part));
      }
    } else {
      parts.push_back(*attribute);
    }
  }
  return [parts, ignore_case, default_value](const Value& item) {
    Value v = item;
    for (const Value& part : parts) {
      v = get_item(v, part);
      if (default_value && v.is_undefined()) v = *default_value;
    }
    if (ignore_case && v.is_string()) return Value::string(py::lower(v.as_string()));
    return v;
  };
}

namespace {

Value abs_filter(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("abs", args, {});
  if (v.is_float()) return Value::floating(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    int64_t i = v.as_integer_like();
    return Value::integer(i < 0 ? py::int_sub(0, i) : i);
  }
  require_defined(v);
  runtime_error(fmt::format("bad operand type for abs(): '{}'", v.type_name()));
}

// attr(name): the attribute only, never the item.
Value attr_filter(Interpreter&, const Value& v, const CallArgs& args) {
  auto a = bind_args("attr", args, {"name"}, 1);
  if (!a[0]->is_string()) runtime_error("attribute name must be string");
  const std::string& name = a[0]->as_string();
  require_defined(v);  // hasattr() on an Undefined raises
  if (std::optional<Value> method = lookup_method(v, name)) return *method;
  if (v.is_object()) return v.as_object().attribute(name);
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", v.is_none() ? "None" : v.type_name() + " object", name));
}

Value length_filter(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("length", args, {});
  return Value::integer(length(v));
}

Value default_filter(Interpreter&, const Value& v, const CallArgs& args) {
  auto a = bind_args("default", args, {"default_value", "boolean"});
  if (v.is_undefined() || (bool_arg(a[1], false) && !v.truthy())) return a[0] ? *a[0] : Value::string("");
  return v;
}

Value int_filter(Interpreter&, const Value& v, const CallArgs& args) {
  auto a = bind_args("int", args, {"default", "base"});
  Value fallback = a[0] ? *a[0] : Value::integer(0);
  int64_t base = int_arg(a[1], 10, "int", "base");
  require_defined(v);
  auto from_float = [&](double f) -> Value {
    if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(std::trunc(f)));
  };
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_integer_like());
  if (v.is_float()) return from_float(v.as_float());
  if (v.is_string()) {
    if (base == 0 || (base >= 2 && base <= 36))
      if (auto i = py::parse_int(v.as_string(), static_cast<int>(base))) return Value::integer(*i);
    if (auto f = py::parse_float(v.as_string())) return from_float(*f);
  }
  return fallback;
}

Value float_filter(Interpreter&, const Value& v, const CallArgs& args) {
  auto a = bind_args("float", args, {"default"});
  Value fallback = a[0] ? *a[0] : Value::floating(0.0);
  require_defined(v);
  if (v.is_numeric()) return Value::floating(v.as_number());
  if (v.is_string())
    if (auto f = py::parse_float(v.as_string())) return Value::floating(*f);
  return fallback;
}

Value round_filter(Interpreter&, const Value& v, const CallArgs& args) {
  auto a = bind_args("round", args, {"precision", "method"});
  int64_t precision = int_arg(a[0], 0, "round", "precision");
  std::string method = string_arg(a[1], "common", "round", "method");
  if (method != "common" && method != "ceil" && method != "floor")
    runtime_error("method must be common, ceil or floor");
  require_defined(v);
  if (!v.is_numeric()) runtime_error(fmt::format("type {} doesn't define __round__ method", v.type_name()));
  if (method == "common") {
    if (v.is_float()) return Value::floating(py::round_float(v.as_float(), precision));
    return Value::integer(py::round_int(v.as_integer_like(), precision));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_number() * scale;
  return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False); no HTML escaping, unlike Jinja's own tojson.
Value tojson_filter(Interpreter& in, const Value& v, const CallArgs& args) {
  auto a = bind_args("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions options;
  options.ensure_ascii = bool_arg(a[0], false);
  if (a[1] && !a[1]->is_none()) {
    if (a[1]->is_string()) {
      options.indent = a[1]->as_string();
    } else {
      int64_t n = int_arg(a[1], 0, "tojson", "indent");
      if (n > 1000) limit_error("tojson indent is too large");
      options.indent = std::string(n > 0 ? static_cast<size_t>(n) : 0, ' ');
    }
  }
  if (a[2] && !a[2]->is_none()) {
    const Value& seps = *a[2];
    if (!seps.is_sequence() || seps.items().size() != 2 || !seps.items()[0].is_string() ||
        !seps.items()[1].is_string())
      runtime_error("tojson separators must be a pair of strings");
    options.item_separator = seps.items()[0].as_string();
    options.key_separator = seps.items()[1].as_string();
  }
  options.sort_keys = bool_arg(a[3], false);
  std::string out = json_dumps(v, options);
  in.check_string_size(out.size());
  return Value::string(std::move(out));
}

}  // namespace
}  // namespace filters

FilterFn lookup_filter(std::string_view name) {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", filters::abs_filter},
      {"attr", filters::attr_filter},
      {"batch", filters::batch},
      {"capitalize", filters::capitalize},
      {"center", filters::center},
      {"count", filters::length_filter},
      {"d", filters::default_filter},
      {"default", filters::default_filter},
      {"dictsort", filters::dictsort},
      {"e", filters::escape},
      {"escape", filters::escape},
      {"first", filters::first},
      {"float", filters::float_filter},
      {"forceescape", filters::forceescape},
      {"format", filters::format},
      {"groupby", filters::groupby},
      {"indent", filters::indent},
      {"int", filters::int_filter},
      {"items", filters::items},
      {"join", filters::join},
      {"last", filters::last},
      {"length", filters::length_filter},
      {"list", filters::list},
      {"lower", filters::lower},
      {"map", filters::map},
      {"max", filters::max},
      {"min", filters::min},
      {"reject", filters::reject},
      {"rejectattr", filters::rejectattr},
      {"replace", filters::replace},
      {"reverse", filters::reverse},
      {"round", filters::round_filter},
      {"safe", filters::safe},
      {"select", filters::select},
      {"selectattr", filters::selectattr},
      {"slice", filters::slice},
      {"sort", filters::sort},
      {"string", filters::string},
      {"striptags", filters::striptags},
      {"sum", filters::sum},
      {"title", filters::title},
      {"tojson", filters::tojson_filter},
      {"trim", filters::trim},
      {"truncate", filters::truncate},
      {"unique", filters::unique},
      {"upper", filters::upper},
      {"wordcount", filters::wordcount},
  };
  auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace moeserve::text::jinja
