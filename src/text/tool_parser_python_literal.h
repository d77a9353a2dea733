// Python literals as JSON: the fallback for tool-call argument values that a model wrote
// in Python syntax rather than JSON. The Qwen3.5 chat template renders scalar arguments
// with Jinja's `| string` (True, False, None, 'text'), and models trained on such
// prompts answer in kind; vLLM's qwen3_coder parser reads those with ast.literal_eval.
//
// Accepted (what ast.literal_eval accepts and JSON can represent): dicts, lists, tuples
// (as arrays), strings ('..', "..", triple quotes, r/u prefixes, adjacent literals
// concatenated, Python escapes), ints (with _ separators, 0x/0o/0b), floats, a single
// leading sign, True/False/None. JSON's true/false/null are accepted as well. Rejected:
// sets, bytes, complex numbers, non-finite floats, dict keys that are containers,
// nesting deeper than 64.
#pragma once
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moeserve::text {

// The JSON value of `text` read as one Python literal (surrounding whitespace allowed),
// or nullopt when it is not one.
std::optional<nlohmann::ordered_json> parse_python_literal(std::string_view text);

}  // namespace moeserve::text
