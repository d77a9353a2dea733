// Python semantics of the operators and protocols templates use: arithmetic, comparison,
// `in`, len(), iteration, and Jinja's attribute/item lookup (environment.getattr and
// getitem of the sandboxed environment). Errors read like Python's (TypeError messages).
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace moeserve::text::jinja {

// Raises the error that using an undefined value gives (its UndefinedError message, or
// the SecurityError for a forbidden method).
[[noreturn]] void raise_undefined(const Value& v);
inline void require_defined(const Value& v) {
  if (v.is_undefined()) raise_undefined(v);
}

// a <op> b. Results longer than max_result_bytes (strings) are a limit error.
Value binary_op(BinaryOp op, const Value& a, const Value& b, size_t max_result_bytes);
Value negate(const Value& v);
Value unary_plus(const Value& v);

bool compare(CompareOp op, const Value& a, const Value& b);
// a < b in Python's ordering (numbers, str, lists/tuples lexicographically).
bool less_than(const Value& a, const Value& b);
// item in container.
bool contains(const Value& container, const Value& item);
// len(v); TypeError for values without a length.
int64_t length(const Value& v);
// list(iter(v)): str -> characters, dict -> keys, undefined -> nothing.
std::vector<Value> iterate(const Value& v);

// obj.name: Python attribute (methods) first, then obj[name].
Value get_attribute(const Value& obj, std::string_view name);
// obj[key]: item first, then the attribute for str keys; undefined when missing.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step].
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

}  // namespace moeserve::text::jinja
