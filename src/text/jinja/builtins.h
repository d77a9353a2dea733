// The global functions a chat template can call: Jinja's range, dict, namespace,
// cycler and joiner (range capped like the sandbox), and transformers' raise_exception
// and strftime_now.
#pragma once
#include "text/jinja/interpreter.h"

namespace moeserve::text::jinja {

// Adds the builtin globals to `scope`.
void install_builtins(Scope& scope);

}  // namespace moeserve::text::jinja
