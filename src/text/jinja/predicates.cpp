#include "text/jinja/predicates.h"

#include <unordered_map>

#include <fmt/format.h>

#include "text/jinja/call_args.h"
#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/filters.h"
#include "text/jinja/operators.h"
#include "text/jinja/py_string.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {
namespace {

const Value& one_arg(const CallArgs& args, const char* test) {
  auto a = bind_args(test, args, {"other"}, 1);
  (void)a;
  return args.positional.empty() ? args.keywords[0].second : args.positional[0];
}

bool no_args(const CallArgs& args, const char* test) {
  bind_args(test, args, {});
  return true;
}

bool is_odd(Interpreter& in, const Value& v, const CallArgs& args) {
  no_args(args, "odd");
  return python_equals(binary_op(BinaryOp::kMod, v, Value::integer(2), in.limits().max_output_bytes), Value::integer(1));
}

bool is_even(Interpreter& in, const Value& v, const CallArgs& args) {
  no_args(args, "even");
  return python_equals(binary_op(BinaryOp::kMod, v, Value::integer(2), in.limits().max_output_bytes), Value::integer(0));
}

bool is_divisibleby(Interpreter& in, const Value& v, const CallArgs& args) {
  const Value& num = one_arg(args, "divisibleby");
  return python_equals(binary_op(BinaryOp::kMod, v, num, in.limits().max_output_bytes), Value::integer(0));
}

bool is_defined(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "defined") && !v.is_undefined(); }
bool is_undefined(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "undefined") && v.is_undefined(); }
bool is_none(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "none") && v.is_none(); }
bool is_boolean(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "boolean") && v.is_bool(); }
bool is_false(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "false") && v.is_bool() && !v.as_bool(); }
bool is_true(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "true") && v.is_bool() && v.as_bool(); }
bool is_integer(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "integer") && v.is_int(); }
bool is_float(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "float") && v.is_float(); }
bool is_number(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "number") && v.is_numeric(); }
bool is_string(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "string") && v.is_string(); }
bool is_mapping(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "mapping") && v.is_dict(); }
bool is_escaped(Interpreter&, const Value& v, const CallArgs& a) { return no_args(a, "escaped") && v.is_markup(); }

// len(x) and x.__getitem__ both exist: str, list, tuple, dict, and (like Jinja's
// Undefined) undefined values.
bool is_sequence(Interpreter&, const Value& v, const CallArgs& a) {
  no_args(a, "sequence");
  return v.is_undefined() || v.is_string() || v.is_dict() ||
         (v.is_sequence() && v.as_sequence().kind != SequenceKind::kGenerator);
}

bool is_iterable(Interpreter&, const Value& v, const CallArgs& a) {
  no_args(a, "iterable");
  return v.is_undefined() || v.is_string() || v.is_dict() || v.is_sequence() ||
         (v.is_object() && v.as_object().type_name() == "LoopContext");
}

// Jinja's Undefined is callable (calling it raises), so `undefined is callable` is true.
bool is_callable(Interpreter&, const Value& v, const CallArgs& a) {
  no_args(a, "callable");
  return v.is_undefined() || (v.is_object() && v.as_object().callable());
}

bool is_lower(Interpreter&, const Value& v, const CallArgs& a) {
  no_args(a, "lower");
  return py::is_lower(to_str(v));
}

bool is_upper(Interpreter&, const Value& v, const CallArgs& a) {
  no_args(a, "upper");
  return py::is_upper(to_str(v));
}

// `x is sameas y`: Python identity. Singletons and small ints are identical by value;
// containers and objects by storage.
bool is_sameas(Interpreter&, const Value& v, const CallArgs& args) {
  const Value& other = one_arg(args, "sameas");
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Kind::kNone: return true;
    case Kind::kBool: return v.as_bool() == other.as_bool();
    case Kind::kInt: return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Kind::kSequence: return &v.as_sequence() == &other.as_sequence();
    case Kind::kDict: return &v.as_dict() == &other.as_dict();
    case Kind::kObject: return v.object_ptr() == other.object_ptr();
    case Kind::kString: return &v.as_string() == &other.as_string();
    default: return false;
  }
}

bool is_in(Interpreter&, const Value& v, const CallArgs& args) { return contains(one_arg(args, "in"), v); }

bool is_filter(Interpreter&, const Value& v, const CallArgs& a) {
  no_args(a, "filter");
  return v.is_string() && lookup_filter(v.as_string()) != nullptr;
}

bool is_test(Interpreter&, const Value& v, const CallArgs& a) {
  no_args(a, "test");
  return v.is_string() && lookup_test(v.as_string()) != nullptr;
}

template <CompareOp Op>
bool compare_test(Interpreter&, const Value& v, const CallArgs& args) {
  return compare(Op, v, one_arg(args, "comparison"));
}

}  // namespace

TestFn lookup_test(std::string_view name) {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"odd", is_odd},
      {"even", is_even},
      {"divisibleby", is_divisibleby},
      {"defined", is_defined},
      {"undefined", is_undefined},
      {"filter", is_filter},
      {"test", is_test},
      {"none", is_none},
      {"boolean", is_boolean},
      {"false", is_false},
      {"true", is_true},
      {"integer", is_integer},
      {"float", is_float},
      {"lower", is_lower},
      {"upper", is_upper},
      {"string", is_string},
      {"mapping", is_mapping},
      {"number", is_number},
      {"sequence", is_sequence},
      {"iterable", is_iterable},
      {"callable", is_callable},
      {"sameas", is_sameas},
      {"escaped", is_escaped},
      {"in", is_in},
      {"==", compare_test<CompareOp::kEq>},
      {"eq", compare_test<CompareOp::kEq>},
      {"equalto", compare_test<CompareOp::kEq>},
      {"!=", compare_test<CompareOp::kNe>},
      {"ne", compare_test<CompareOp::kNe>},
      {">", compare_test<CompareOp::kGt>},
      {"gt", compare_test<CompareOp::kGt>},
      {"greaterthan", compare_test<CompareOp::kGt>},
      {">=", compare_test<CompareOp::kGe>},
      {"ge", compare_test<CompareOp::kGe>},
      {"<", compare_test<CompareOp::kLt>},
      {"lt", compare_test<CompareOp::kLt>},
      {"lessthan", compare_test<CompareOp::kLt>},
      {"<=", compare_test<CompareOp::kLe>},
      {"le", compare_test<CompareOp::kLe>},
  };
  auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace moeserve::text::jinja
