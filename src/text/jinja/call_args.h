// Arguments of a call (function, method, filter, test, macro) and their binding to a
// Python-style signature, with Python's error messages for bad calls.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace moeserve::text::jinja {

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;

  bool empty() const { return positional.empty() && keywords.empty(); }
};

// Matches `args` to parameters `names` (positional-or-keyword, in order). Returns one
// slot per name, nullopt where not given. Throws TypeError-style errors for too many
// positionals, unknown or duplicate keywords, or fewer than `required` given.
std::vector<std::optional<Value>> bind_args(std::string_view function, const CallArgs& args,
                                            std::initializer_list<std::string_view> names, size_t required = 0);

// Typed accessors for bound slots (Python's rules: bool is an int; ints are not floats
// for integer parameters).
int64_t int_arg(const std::optional<Value>& v, int64_t fallback, std::string_view function, std::string_view name);
bool bool_arg(const std::optional<Value>& v, bool fallback);
// A str argument; other values are rejected with a TypeError naming the parameter.
std::string string_arg(const std::optional<Value>& v, std::string fallback, std::string_view function,
                       std::string_view name);
// str, or None (nullopt); anything else is a TypeError.
std::optional<std::string> optional_string_arg(const std::optional<Value>& v, std::string_view function,
                                               std::string_view name);

}  // namespace moeserve::text::jinja
