// Jinja's builtin tests for `x is name` (jinja2.tests): defined, none, string, mapping,
// sequence, iterable, odd, divisibleby, eq, ...
#pragma once
#include <string_view>

#include "text/jinja/ast.h"

namespace moeserve::text::jinja {

// nullptr when there is no such test.
TestFn lookup_test(std::string_view name);

}  // namespace moeserve::text::jinja
