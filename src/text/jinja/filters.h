// Jinja's builtin filters (jinja2.filters), with transformers' tojson. Looked up by name
// at parse time; see filters_*.cpp for the implementations.
#pragma once
#include <string_view>

#include "text/jinja/ast.h"

namespace moeserve::text::jinja {

// nullptr when there is no such filter.
FilterFn lookup_filter(std::string_view name);

}  // namespace moeserve::text::jinja
