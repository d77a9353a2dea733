// str() and repr() of runtime values, as Python prints them: what `{{ x }}` outputs and
// how lists/dicts/tuples show their items ("[1, 'a', None, True, 1.0]").
#pragma once
#include <string>

#include "text/jinja/value.h"

namespace moeserve::text::jinja {

// Python str(x). Undefined prints as the empty string (Jinja's default Undefined).
std::string to_str(const Value& v);
// Python repr(x).
std::string to_repr(const Value& v);

}  // namespace moeserve::text::jinja
