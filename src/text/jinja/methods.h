// Python methods of str, list, tuple and dict as templates call them
// (message.content.startswith(...), tool.items(), ...), following the sandbox
// transformers uses: methods that would mutate a list or dict (append, pop, update, ...)
// and dunder attributes are "unsafe" and fail when called.
#pragma once
#include <optional>
#include <string_view>

#include "text/jinja/value.h"

namespace moeserve::text::jinja {

// The attribute `name` of a str/list/tuple/dict when it is a Python method: a bound
// method, or an undefined that raises a SecurityError when used; nullopt when the type
// has no such attribute.
std::optional<Value> lookup_method(const Value& receiver, std::string_view name);

}  // namespace moeserve::text::jinja
