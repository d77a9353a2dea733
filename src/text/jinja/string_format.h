// Python string formatting: printf-style `format % args` (the % operator and Jinja's
// |format filter) and str.format() with the format-spec mini-language.
#pragma once
#include <string>

#include "text/jinja/call_args.h"
#include "text/jinja/value.h"

namespace moeserve::text::jinja {

// `format % args`: a tuple gives the positional values, a dict serves %(name)s lookups,
// anything else is the single value. With escape_args (a Markup format), values
// converted by %s/%r are HTML-escaped like markupsafe does.
std::string percent_format(const std::string& format, const Value& args, bool escape_args);

// format.format(*args, **kwargs).
std::string str_format(const std::string& format, const CallArgs& args);

// format(value, spec): one value through the format-spec mini-language.
std::string format_value(const Value& value, const std::string& spec);

}  // namespace moeserve::text::jinja
