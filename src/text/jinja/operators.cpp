#include "text/jinja/operators.h"

#include <cmath>

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/methods.h"
#include "text/jinja/py_number.h"
#include "text/jinja/py_string.h"
#include "text/jinja/string_format.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {
namespace {

constexpr size_t kMaxSequenceItems = 10'000'000;

const char* op_symbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "+";
    case BinaryOp::kSub: return "-";
    case BinaryOp::kMul: return "*";
    case BinaryOp::kDiv: return "/";
    case BinaryOp::kFloorDiv: return "//";
    case BinaryOp::kMod: return "%";
    case BinaryOp::kPow: return "** or pow()";
  }
  return "?";
}

[[noreturn]] void unsupported(BinaryOp op, const Value& a, const Value& b) {
  runtime_error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op_symbol(op), a.type_name(),
                            b.type_name()));
}

// Jinja's object_type_repr, used in "has no attribute" messages.
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return v.type_name() + " object";
}

Value missing_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

Value missing_element(const Value& obj, const Value& key) {
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), to_repr(key)));
}

void check_size(size_t bytes, size_t limit) {
  if (bytes > limit) limit_error(fmt::format("a string would grow to {} bytes, over the limit of {}", bytes, limit));
}

Value repeat(const Value& seq, int64_t times, size_t max_bytes) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(times) > max_bytes / s.size()) check_size(SIZE_MAX, max_bytes);
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value::string(std::move(out), seq.is_markup());
  }
  const auto& items = seq.items();
  if (!items.empty() && static_cast<uint64_t>(times) > kMaxSequenceItems / items.size())
    limit_error("a list would grow past 10 million items");
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(times));
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::sequence(std::move(out), seq.as_sequence().kind);
}

bool is_plain_sequence(const Value& v) { return v.is_sequence() && v.as_sequence().kind != SequenceKind::kGenerator; }
// list or tuple: the sequences Python concatenates, repeats and orders.
bool is_list_or_tuple(const Value& v) { return v.is_list() || v.is_tuple(); }

Value add(const Value& a, const Value& b, size_t max_bytes) {
  if (a.is_numeric() && b.is_numeric()) {
    if (a.is_float() || b.is_float()) return Value::floating(a.as_number() + b.as_number());
    return Value::integer(py::int_add(a.as_integer_like(), b.as_integer_like()));
  }
  if (a.is_string() && b.is_string()) {
    check_size(a.as_string().size() + b.as_string().size(), max_bytes);
    // markupsafe: Markup + str escapes the str (and str + Markup likewise).
    if (a.is_markup() && !b.is_markup()) return Value::string(a.as_string() + py::html_escape(b.as_string()), true);
    if (!a.is_markup() && b.is_markup()) return Value::string(py::html_escape(a.as_string()) + b.as_string(), true);
    return Value::string(a.as_string() + b.as_string(), a.is_markup());
  }
  if (is_list_or_tuple(a) && is_list_or_tuple(b) && a.as_sequence().kind == b.as_sequence().kind) {
    if (a.items().size() + b.items().size() > kMaxSequenceItems) limit_error("a list would grow past 10 million items");
    std::vector<Value> out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    return Value::sequence(std::move(out), a.as_sequence().kind);
  }
  if (a.is_string() && !b.is_undefined())
    runtime_error(fmt::format("can only concatenate str (not \"{}\") to str", b.type_name()));
  if (a.is_list() && !b.is_undefined())
    runtime_error(fmt::format("can only concatenate list (not \"{}\") to list", b.type_name()));
  unsupported(BinaryOp::kAdd, a, b);
}

Value arithmetic(BinaryOp op, const Value& a, const Value& b) {
  if (!(a.is_numeric() && b.is_numeric())) unsupported(op, a, b);
  bool floats = a.is_float() || b.is_float();
  if (op == BinaryOp::kDiv) {
    double y = b.as_number();
    if (y == 0.0) runtime_error(floats ? "float division by zero" : "division by zero");
    return Value::floating(a.as_number() / y);
  }
  if (floats) {
    double x = a.as_number(), y = b.as_number();
    switch (op) {
      case BinaryOp::kSub: return Value::floating(x - y);
      case BinaryOp::kMul: return Value::floating(x * y);
      case BinaryOp::kFloorDiv: return Value::floating(py::float_floordiv(x, y));
      case BinaryOp::kMod: return Value::floating(py::float_mod(x, y));
      case BinaryOp::kPow: return Value::floating(py::float_pow(x, y));
      default: break;
    }
  } else {
    int64_t x = a.as_integer_like(), y = b.as_integer_like();
    switch (op) {
      case BinaryOp::kSub: return Value::integer(py::int_sub(x, y));
      case BinaryOp::kMul: return Value::integer(py::int_mul(x, y));
      case BinaryOp::kFloorDiv: return Value::integer(py::int_floordiv(x, y));
      case BinaryOp::kMod: return Value::integer(py::int_mod(x, y));
      case BinaryOp::kPow:
        if (y < 0) return Value::floating(py::float_pow(static_cast<double>(x), static_cast<double>(y)));
        return Value::integer(py::int_pow(x, y));
      default: break;
    }
  }
  unsupported(op, a, b);
}

const char* compare_symbol(CompareOp op) {
  switch (op) {
    case CompareOp::kLt: return "<";
    case CompareOp::kLe: return "<=";
    case CompareOp::kGt: return ">";
    case CompareOp::kGe: return ">=";
    default: return "==";
  }
}

// Three-way Python ordering; throws TypeError naming `symbol` for unorderable types.
int order(const Value& a, const Value& b, const char* symbol, int depth = 0) {
  if (depth > kMaxNestingDepth) runtime_error("maximum recursion depth exceeded in comparison");
  if (a.is_numeric() && b.is_numeric()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_number(), y = b.as_number();
      return x < y ? -1 : (x > y ? 1 : 0);  // NaN compares as "equal" here; callers use < only
    }
    int64_t x = a.as_integer_like(), y = b.as_integer_like();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (is_list_or_tuple(a) && is_list_or_tuple(b) && a.as_sequence().kind == b.as_sequence().kind) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!python_equals(x[i], y[i], depth + 1)) return order(x[i], y[i], symbol, depth + 1);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  require_defined(a);
  require_defined(b);
  runtime_error(fmt::format("'{}' not supported between instances of '{}' and '{}'", symbol, a.type_name(),
                            b.type_name()));
}

// Float comparisons must respect NaN (every ordering comparison with NaN is false).
bool float_compare(CompareOp op, double x, double y) {
  switch (op) {
    case CompareOp::kLt: return x < y;
    case CompareOp::kLe: return x <= y;
    case CompareOp::kGt: return x > y;
    case CompareOp::kGe: return x >= y;
    default: return false;
  }
}

}  // namespace

void raise_undefined(const Value& v) { runtime_error(v.undefined_message()); }

Value binary_op(BinaryOp op, const Value& a, const Value& b, size_t max_result_bytes) {
  require_defined(a);
  require_defined(b);
  switch (op) {
    case BinaryOp::kAdd: return add(a, b, max_result_bytes);
    case BinaryOp::kMul:
      if ((a.is_string() || is_list_or_tuple(a)) && (b.is_int() || b.is_bool()))
        return repeat(a, b.as_integer_like(), max_result_bytes);
      if ((b.is_string() || is_list_or_tuple(b)) && (a.is_int() || a.is_bool()))
        return repeat(b, a.as_integer_like(), max_result_bytes);
      if (a.is_string() || b.is_string() || a.is_sequence() || b.is_sequence())
        runtime_error(fmt::format("can't multiply sequence by non-int of type '{}'",
                                  (a.is_string() || a.is_sequence()) ? b.type_name() : a.type_name()));
      return arithmetic(op, a, b);
    case BinaryOp::kMod:
      if (a.is_string()) {
        std::string out = percent_format(a.as_string(), b, a.is_markup());
        check_size(out.size(), max_result_bytes);
        return Value::string(std::move(out), a.is_markup());
      }
      return arithmetic(op, a, b);
    default: return arithmetic(op, a, b);
  }
}

Value negate(const Value& v) {
  require_defined(v);
  if (v.is_float()) return Value::floating(-v.as_float());
  if (v.is_int() || v.is_bool()) return Value::integer(py::int_sub(0, v.as_integer_like()));
  runtime_error(fmt::format("bad operand type for unary -: '{}'", v.type_name()));
}

Value unary_plus(const Value& v) {
  require_defined(v);
  if (v.is_float()) return v;
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_integer_like());
  runtime_error(fmt::format("bad operand type for unary +: '{}'", v.type_name()));
}

bool compare(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq: return python_equals(a, b);
    case CompareOp::kNe: return !python_equals(a, b);
    case CompareOp::kIn: return contains(b, a);
    case CompareOp::kNotIn: return !contains(b, a);
    default: break;
  }
  require_defined(a);
  require_defined(b);
  if (a.is_numeric() && b.is_numeric() && (a.is_float() || b.is_float()))
    return float_compare(op, a.as_number(), b.as_number());
  int c = order(a, b, compare_symbol(op));
  switch (op) {
    case CompareOp::kLt: return c < 0;
    case CompareOp::kLe: return c <= 0;
    case CompareOp::kGt: return c > 0;
    case CompareOp::kGe: return c >= 0;
    default: return false;
  }
}

bool less_than(const Value& a, const Value& b) { return compare(CompareOp::kLt, a, b); }

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (!item.is_string())
        runtime_error(fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::kSequence:
      for (const Value& v : container.items())
        if (python_equals(v, item)) return true;
      return false;
    case Kind::kDict:
      if (item.is_dict() || item.is_list())
        runtime_error(fmt::format("unhashable type: '{}'", item.type_name()));
      return container.as_dict().find(item) != nullptr;
    default:
      runtime_error(fmt::format("argument of type '{}' is not iterable", container.type_name()));
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(py::length(v.as_string()));
    case Kind::kSequence:
      if (v.as_sequence().kind == SequenceKind::kGenerator) break;
      return static_cast<int64_t>(v.items().size());
    case Kind::kDict: return static_cast<int64_t>(v.as_dict().size());
    case Kind::kObject:
      if (v.as_object().length() >= 0) return v.as_object().length();
      break;
    default: break;
  }
  runtime_error(fmt::format("object of type '{}' has no len()", v.type_name()));
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return {};
    case Kind::kString: {
      std::vector<Value> out;
      const std::string& s = v.as_string();
      size_t pos = 0;
      while (pos < s.size()) {
        size_t start = pos;
        py::decode_utf8(s, pos);
        out.push_back(Value::string(s.substr(start, pos - start)));
      }
      return out;
    }
    case Kind::kSequence: return v.items();
    case Kind::kDict: {
      std::vector<Value> out;
      out.reserve(v.as_dict().size());
      for (const auto& entry : v.as_dict().entries()) out.push_back(entry.first);
      return out;
    }
    default: runtime_error(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

Value get_attribute(const Value& obj, std::string_view name) {
  require_defined(obj);
  if (std::optional<Value> method = lookup_method(obj, name)) return *method;
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
    return missing_attribute(obj, name);
  }
  if (obj.is_object()) return obj.as_object().attribute(name);
  return missing_attribute(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  if ((obj.is_string() || is_plain_sequence(obj)) && (key.is_int() || key.is_bool())) {
    int64_t index = key.as_integer_like();
    int64_t len = length(obj);
    if (index < 0) index += len;
    if (index < 0 || index >= len) return missing_element(obj, key);
    if (obj.is_string()) return Value::string(py::substr(obj.as_string(), index, index + 1), obj.is_markup());
    return obj.items()[static_cast<size_t>(index)];
  }
  if (obj.is_dict() && !key.is_dict() && !key.is_list()) {
    if (const Value* v = obj.as_dict().find(key)) return *v;
  }
  if (key.is_string()) {
    if (std::optional<Value> method = lookup_method(obj, key.as_string())) return *method;
    if (obj.is_object()) return obj.as_object().attribute(key.as_string());
    return missing_attribute(obj, key.as_string());
  }
  return missing_element(obj, key);
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  // Jinja compiles x[a:b] to a plain Python subscript (no environment.getitem), so
  // every failure is an error here, unlike x[i].
  require_defined(obj);
  if (obj.is_dict()) runtime_error("unhashable type: 'slice'");
  if (!(obj.is_string() || is_plain_sequence(obj)))
    runtime_error(fmt::format("'{}' object is not subscriptable", obj.type_name()));
  auto index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (v.is_int() || v.is_bool()) return v.as_integer_like();
    runtime_error("slice indices must be integers or None or have an __index__ method");
  };
  std::optional<int64_t> b = index(start), e = index(stop), s = index(step);
  int64_t stride = s.value_or(1);
  if (stride == 0) runtime_error("slice step cannot be zero");
  if (obj.is_string()) {
    const std::string& text = obj.as_string();
    if (stride == 1 && py::is_ascii(text)) {
      auto idx = py::slice_indices(static_cast<int64_t>(text.size()), b, e, 1);
      if (idx.empty()) return Value::string("", obj.is_markup());
      return Value::string(text.substr(idx.front(), idx.size()), obj.is_markup());
    }
    std::u32string chars = py::to_u32(text);
    std::u32string out;
    for (int64_t i : py::slice_indices(static_cast<int64_t>(chars.size()), b, e, stride)) out.push_back(chars[i]);
    return Value::string(py::to_utf8(out), obj.is_markup());
  }
  const auto& items = obj.items();
  std::vector<int64_t> picked = py::slice_indices(static_cast<int64_t>(items.size()), b, e, stride);
  if (obj.as_sequence().kind == SequenceKind::kRange) {
    // range(...)[a:b:c] is a range again, built from slice.indices() like Python.
    const Sequence& r = obj.as_sequence();
    auto bounds = py::slice_bounds(static_cast<int64_t>(items.size()), b, e, stride);
    int64_t new_start = r.range_start + bounds.first * r.range_step;
    int64_t new_stop = r.range_start + bounds.second * r.range_step;
    int64_t new_step = r.range_step * stride;
    return Value::range(new_start, new_stop, new_step);
  }
  std::vector<Value> out;
  for (int64_t i : picked) out.push_back(items[i]);
  return Value::sequence(std::move(out), obj.as_sequence().kind);
}

}  // namespace moeserve::text::jinja
