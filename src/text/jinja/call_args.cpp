#include "text/jinja/call_args.h"

#include <algorithm>

#include <fmt/format.h>

#include "text/jinja/error.h"

namespace moeserve::text::jinja {

std::vector<std::optional<Value>> bind_args(std::string_view function, const CallArgs& args,
                                            std::initializer_list<std::string_view> names, size_t required) {
  std::vector<std::string_view> params(names);
  std::vector<std::optional<Value>> slots(params.size());
  if (args.positional.size() > params.size()) {
    runtime_error(fmt::format("{}() takes at most {} argument{} ({} given)", function, params.size(),
                              params.size() == 1 ? "" : "s", args.positional.size()));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) slots[i] = args.positional[i];
  for (const auto& [key, value] : args.keywords) {
    auto it = std::find(params.begin(), params.end(), key);
    if (it == params.end()) runtime_error(fmt::format("{}() got an unexpected keyword argument '{}'", function, key));
    size_t index = static_cast<size_t>(it - params.begin());
    if (slots[index]) runtime_error(fmt::format("{}() got multiple values for argument '{}'", function, key));
    slots[index] = value;
  }
  for (size_t i = 0; i < required; ++i) {
    if (!slots[i]) runtime_error(fmt::format("{}() missing required argument '{}'", function, params[i]));
  }
  return slots;
}

int64_t int_arg(const std::optional<Value>& v, int64_t fallback, std::string_view function, std::string_view name) {
  if (!v) return fallback;
  if (v->is_int() || v->is_bool()) return v->as_integer_like();
  runtime_error(fmt::format("{}(): argument '{}' must be an integer, not '{}'", function, name, v->type_name()));
}

bool bool_arg(const std::optional<Value>& v, bool fallback) { return v ? v->truthy() : fallback; }

std::string string_arg(const std::optional<Value>& v, std::string fallback, std::string_view function,
                       std::string_view name) {
  if (!v) return fallback;
  if (v->is_string()) return v->as_string();
  runtime_error(fmt::format("{}(): argument '{}' must be str, not '{}'", function, name, v->type_name()));
}

std::optional<std::string> optional_string_arg(const std::optional<Value>& v, std::string_view function,
                                               std::string_view name) {
  if (!v || v->is_none()) return std::nullopt;
  if (v->is_string()) return v->as_string();
  runtime_error(fmt::format("{}(): argument '{}' must be str or None, not '{}'", function, name, v->type_name()));
}

}  // namespace moeserve::text::jinja
