// Filter implementations, shared between filters*.cpp (internal to the jinja folder).
// Each follows the jinja2.filters function of the same name.
#pragma once
#include <functional>
#include <optional>

#include "text/jinja/call_args.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/value.h"

namespace moeserve::text::jinja::filters {

// soft_str(): Markup stays Markup, anything else becomes str(x).
Value soft_str(const Value& v);
// jinja's make_attrgetter: "a.b.0" looks up v[a][b][0] (item first, then attribute);
// optionally lowercases strings (case-insensitive sorting) and substitutes a default
// for undefined results.
std::function<Value(const Value&)> make_attrgetter(const std::optional<Value>& attribute, bool ignore_case,
                                                   std::optional<Value> default_value = std::nullopt);

// filters_string.cpp
Value capitalize(Interpreter&, const Value&, const CallArgs&);
Value center(Interpreter&, const Value&, const CallArgs&);
Value escape(Interpreter&, const Value&, const CallArgs&);
Value forceescape(Interpreter&, const Value&, const CallArgs&);
Value format(Interpreter&, const Value&, const CallArgs&);
Value indent(Interpreter&, const Value&, const CallArgs&);
Value lower(Interpreter&, const Value&, const CallArgs&);
Value replace(Interpreter&, const Value&, const CallArgs&);
Value safe(Interpreter&, const Value&, const CallArgs&);
Value string(Interpreter&, const Value&, const CallArgs&);
Value striptags(Interpreter&, const Value&, const CallArgs&);
Value title(Interpreter&, const Value&, const CallArgs&);
Value trim(Interpreter&, const Value&, const CallArgs&);
Value truncate(Interpreter&, const Value&, const CallArgs&);
Value upper(Interpreter&, const Value&, const CallArgs&);
Value wordcount(Interpreter&, const Value&, const CallArgs&);

// filters_sequence.cpp
Value batch(Interpreter&, const Value&, const CallArgs&);
Value dictsort(Interpreter&, const Value&, const CallArgs&);
Value first(Interpreter&, const Value&, const CallArgs&);
Value groupby(Interpreter&, const Value&, const CallArgs&);
Value items(Interpreter&, const Value&, const CallArgs&);
Value join(Interpreter&, const Value&, const CallArgs&);
Value last(Interpreter&, const Value&, const CallArgs&);
Value list(Interpreter&, const Value&, const CallArgs&);
Value map(Interpreter&, const Value&, const CallArgs&);
Value max(Interpreter&, const Value&, const CallArgs&);
Value min(Interpreter&, const Value&, const CallArgs&);
Value reject(Interpreter&, const Value&, const CallArgs&);
Value rejectattr(Interpreter&, const Value&, const CallArgs&);
Value reverse(Interpreter&, const Value&, const CallArgs&);
Value select(Interpreter&, const Value&, const CallArgs&);
Value selectattr(Interpreter&, const Value&, const CallArgs&);
Value slice(Interpreter&, const Value&, const CallArgs&);
Value sort(Interpreter&, const Value&, const CallArgs&);
Value sum(Interpreter&, const Value&, const CallArgs&);
Value unique(Interpreter&, const Value&, const CallArgs&);

}  // namespace moeserve::text::jinja::filters
