#include "text/jinja/value.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "text/jinja/error.h"

namespace moeserve::text::jinja {

// ---- Dict ------------------------------------------------------------------------

const Value* Dict::find(std::string_view key) const {
  auto it = string_index_.find(key);
  return it == string_index_.end() ? nullptr : &entries_[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : entries_)
    if (!k.is_string() && python_equals(k, key)) return &v;
  return nullptr;
}

namespace {

uint32_t checked_depth(uint32_t inner) {
  if (inner + 1 > static_cast<uint32_t>(kMaxNestingDepth))
    runtime_error(fmt::format("maximum recursion depth exceeded: containers nested deeper than {} levels",
                              kMaxNestingDepth));
  return inner + 1;
}

}  // namespace

void Dict::set(Value key, Value value) {
  depth_ = std::max(depth_, checked_depth(std::max(key.nesting_depth(), value.nesting_depth())));
  if (key.is_list())
    runtime_error(fmt::format("unhashable type: '{}'", key.type_name()));
  if (key.is_dict()) runtime_error("unhashable type: 'dict'");
  if (key.is_string()) {
    auto [it, inserted] = string_index_.try_emplace(key.as_string(), entries_.size());
    if (!inserted) {
      entries_[it->second].second = std::move(value);
      return;
    }
    entries_.emplace_back(std::move(key), std::move(value));
    return;
  }
  for (auto& [k, v] : entries_) {
    if (!k.is_string() && python_equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

// ---- Value -----------------------------------------------------------------------

Value Value::undefined(std::string message, bool security) {
  return Value(Storage(std::make_shared<const UndefinedInfo>(UndefinedInfo{std::move(message), security})));
}
Value Value::none() { return Value(Storage(std::monostate{})); }
Value Value::boolean(bool b) { return Value(Storage(b)); }
Value Value::integer(int64_t i) { return Value(Storage(i)); }
Value Value::floating(double f) { return Value(Storage(f)); }
Value Value::string(std::string s, bool markup) {
  return Value(Storage(StringData{std::make_shared<const std::string>(std::move(s)), markup}));
}
Value Value::sequence(std::vector<Value> items, SequenceKind kind) {
  uint32_t inner = 0;
  for (const Value& v : items) inner = std::max(inner, v.nesting_depth());
  Sequence seq;
  seq.items = std::move(items);
  seq.kind = kind;
  seq.depth = checked_depth(inner);
  return Value(Storage(std::make_shared<const Sequence>(std::move(seq))));
}

uint32_t Value::nesting_depth() const {
  if (is_sequence()) return as_sequence().depth;
  if (is_dict()) return as_dict().depth();
  return 0;
}
Value Value::range(int64_t start, int64_t stop, int64_t step) {
  Sequence seq;
  seq.kind = SequenceKind::kRange;
  seq.range_start = start;
  seq.range_stop = stop;
  seq.range_step = step;
  for (int64_t x = start; step > 0 ? x < stop : x > stop;) {
    seq.items.push_back(Value::integer(x));
    if (__builtin_add_overflow(x, step, &x)) break;
  }
  return Value(Storage(std::make_shared<const Sequence>(std::move(seq))));
}

Value Value::dict(std::shared_ptr<const Dict> d) { return Value(Storage(std::move(d))); }
Value Value::object(std::shared_ptr<Object> o) { return Value(Storage(std::move(o))); }

double Value::as_number() const {
  if (is_float()) return as_float();
  return static_cast<double>(as_integer_like());
}

const std::string& Value::undefined_message() const {
  static const std::string kGeneric = "value is undefined";
  const auto& info = std::get<std::shared_ptr<const UndefinedInfo>>(storage_);
  return info ? info->message : kGeneric;
}

bool Value::undefined_is_security() const {
  const auto& info = std::get<std::shared_ptr<const UndefinedInfo>>(storage_);
  return info && info->security;
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_float() != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kSequence:
      return as_sequence().kind == SequenceKind::kGenerator || !as_sequence().items.empty();
    case Kind::kDict: return !as_dict().empty();
    case Kind::kObject: {
      int64_t n = as_object().length();
      return n != 0;  // -1 (no len) is truthy, like a plain Python object
    }
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return is_markup() ? "Markup" : "str";
    case Kind::kSequence:
      switch (as_sequence().kind) {
        case SequenceKind::kList: return "list";
        case SequenceKind::kTuple: return "tuple";
        case SequenceKind::kRange: return "range";
        case SequenceKind::kGenerator: return "generator";
      }
      return "list";
    case Kind::kDict: return "dict";
    case Kind::kObject: return as_object().type_name();
  }
  return "object";
}

// ---- Object defaults ---------------------------------------------------------------

Value Object::attribute(std::string_view name) const {
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(), name));
}

Value Object::call(Interpreter&, const CallArgs&) const {
  runtime_error(fmt::format("'{}' object is not callable", type_name()));
}

// ---- equality --------------------------------------------------------------------

bool python_equals(const Value& a, const Value& b, int depth) {
  if (depth > kMaxNestingDepth) runtime_error("maximum recursion depth exceeded in comparison");
  if (a.is_numeric() && b.is_numeric()) {
    if (a.is_float() || b.is_float()) return a.as_number() == b.as_number();
    return a.as_integer_like() == b.as_integer_like();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.as_string() == b.as_string();
    case Kind::kSequence: {
      const Sequence& x = a.as_sequence();
      const Sequence& y = b.as_sequence();
      if (x.kind == SequenceKind::kGenerator || y.kind == SequenceKind::kGenerator) return &x == &y;
      if (x.kind != y.kind || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!python_equals(x.items[i], y.items[i], depth + 1)) return false;
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.find(key);
        if (!other || !python_equals(value, *other, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kObject: return a.object_ptr() == b.object_ptr();
    default: return false;
  }
}

}  // namespace moeserve::text::jinja
