#include "text/jinja/methods.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "text/jinja/call_args.h"
#include "text/jinja/error.h"
#include "text/jinja/operators.h"
#include "text/jinja/py_string.h"
#include "text/jinja/string_format.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {
namespace {

using MethodFn = Value (*)(const Value& self, const CallArgs& args);

// What markupsafe (3.x) does when the method is called on a Markup string.
enum class MarkupRule : uint8_t {
  kPlain,        // str's method: plain result
  kWrap,         // the result (or each str in it) is Markup
  kEscapeSecond, // Markup result; the second argument (new text, fill char) is escaped
  kEscapeAll,    // Markup result; every argument is escaped (format)
  kEscapeItems,  // Markup result; the items of the iterable argument are escaped (join)
};

struct MethodEntry {
  MethodFn fn;
  MarkupRule markup = MarkupRule::kPlain;
};

class BoundMethod : public Object {
 public:
  BoundMethod(Value self, std::string name, const MethodEntry& entry)
      : self_(std::move(self)), name_(std::move(name)), entry_(entry) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override {
    return fmt::format("<built-in method {} of {} object>", name_, self_.type_name());
  }
  bool callable() const override { return true; }
  Value call(Interpreter&, const CallArgs& args) const override {
    if (entry_.markup == MarkupRule::kPlain || !self_.is_markup()) return entry_.fn(self_, args);
    CallArgs escaped = args;
    auto escape = [](Value& v) {
      if (!v.is_markup()) v = Value::string(py::html_escape(v.is_string() ? v.as_string() : to_str(v)), true);
    };
    switch (entry_.markup) {
      case MarkupRule::kEscapeSecond:
        if (escaped.positional.size() >= 2) escape(escaped.positional[1]);
        for (auto& kv : escaped.keywords) escape(kv.second);
        break;
      case MarkupRule::kEscapeAll:
        for (Value& v : escaped.positional) escape(v);
        for (auto& kv : escaped.keywords) escape(kv.second);
        break;
      case MarkupRule::kEscapeItems:
        if (!escaped.positional.empty()) {
          std::vector<Value> items = iterate(escaped.positional[0]);
          for (Value& item : items) escape(item);
          escaped.positional[0] = Value::sequence(std::move(items));
        }
        break;
      default: break;
    }
    return as_markup(entry_.fn(self_, escaped));
  }

 private:
  static Value as_markup(const Value& v) {
    if (v.is_string()) return Value::string(v.as_string(), true);
    if (v.is_sequence()) {
      std::vector<Value> items;
      for (const Value& item : v.items()) items.push_back(as_markup(item));
      return Value::sequence(std::move(items), v.as_sequence().kind);
    }
    return v;
  }
  Value self_;
  std::string name_;
  const MethodEntry& entry_;
};

// ---- helpers ---------------------------------------------------------------------------

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::sequence(std::move(items));
}

std::optional<int64_t> opt_index(const std::optional<Value>& v, std::string_view fn) {
  if (!v || v->is_none()) return std::nullopt;
  if (v->is_int() || v->is_bool()) return v->as_integer_like();
  runtime_error(fmt::format("slice indices must be integers or None or have an __index__ method ({}())", fn));
}

std::string required_str(const std::optional<Value>& v, std::string_view fn) {
  if (v && v->is_string()) return v->as_string();
  runtime_error(fmt::format("{}() argument must be str, not {}", fn, v ? v->type_name() : "nothing"));
}

py::Bounds bounds_of(const std::string& s, const std::vector<std::optional<Value>>& a, size_t first, std::string_view fn) {
  return py::resolve_bounds(opt_index(a[first], fn), opt_index(a[first + 1], fn),
                            static_cast<int64_t>(py::length(s)));
}

// startswith/endswith: a str or a tuple of str, optional [start:end].
Value affix_test(const Value& self, const CallArgs& args, bool suffix) {
  const char* fn = suffix ? "endswith" : "startswith";
  auto a = bind_args(fn, args, {"affix", "start", "end"}, 1);
  const std::string& s = self.as_string();
  std::vector<std::string> candidates;
  if (a[0]->is_string()) {
    candidates.push_back(a[0]->as_string());
  } else if (a[0]->is_tuple()) {
    for (const Value& v : a[0]->items()) candidates.push_back(required_str(v, fn));
  } else {
    runtime_error(fmt::format("{} first arg must be str or a tuple of str, not {}", fn, a[0]->type_name()));
  }
  py::Bounds b = bounds_of(s, a, 1, fn);
  int64_t len = static_cast<int64_t>(py::length(s));
  if (b.start > len) return Value::boolean(false);
  std::string window = py::substr(s, b.start, std::max(b.start, b.end));
  for (const auto& c : candidates) {
    if (b.end - b.start < static_cast<int64_t>(py::length(c))) continue;
    bool hit = suffix ? window.size() >= c.size() && window.compare(window.size() - c.size(), c.size(), c) == 0
                      : window.compare(0, c.size(), c) == 0;
    if (hit) return Value::boolean(true);
  }
  return Value::boolean(false);
}

Value find_impl(const Value& self, const CallArgs& args, const char* fn, bool reverse, bool raise) {
  auto a = bind_args(fn, args, {"sub", "start", "end"}, 1);
  const std::string& s = self.as_string();
  int64_t r = py::find(s, required_str(a[0], fn), bounds_of(s, a, 1, fn), reverse);
  if (r < 0 && raise) runtime_error("substring not found");
  return Value::integer(r);
}

Value strip_impl(const Value& self, const CallArgs& args, const char* fn, bool left, bool right) {
  auto a = bind_args(fn, args, {"chars"});
  return Value::string(py::strip(self.as_string(), optional_string_arg(a[0], fn, "chars"), left, right));
}

Value split_impl(const Value& self, const CallArgs& args, const char* fn, bool reverse) {
  auto a = bind_args(fn, args, {"sep", "maxsplit"});
  auto sep = optional_string_arg(a[0], fn, "sep");
  int64_t maxsplit = int_arg(a[1], -1, fn, "maxsplit");
  return str_list(reverse ? py::rsplit(self.as_string(), sep, maxsplit) : py::split(self.as_string(), sep, maxsplit));
}

Value justify(const Value& self, const CallArgs& args, const char* fn, char mode) {
  auto a = bind_args(fn, args, {"width", "fillchar"}, 1);
  int64_t width = int_arg(a[0], 0, fn, "width");
  std::string fill = string_arg(a[1], " ", fn, "fillchar");
  if (py::length(fill) != 1) runtime_error("The fill character must be exactly one character long");
  const std::string& s = self.as_string();
  int64_t len = static_cast<int64_t>(py::length(s));
  if (width > 100'000'000) limit_error("justify width is too large");
  if (width <= len) return Value::string(s);
  int64_t margin = width - len;
  int64_t left = mode == '<' ? 0 : mode == '>' ? margin : margin / 2 + (margin & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < margin - left; ++i) out += fill;
  return Value::string(std::move(out));
}

Value partition_impl(const Value& self, const CallArgs& args, const char* fn, bool reverse) {
  auto a = bind_args(fn, args, {"sep"}, 1);
  std::string sep = required_str(a[0], fn);
  if (sep.empty()) runtime_error("empty separator");
  const std::string& s = self.as_string();
  size_t hit = reverse ? s.rfind(sep) : s.find(sep);
  std::vector<Value> parts;
  if (hit == std::string::npos) {
    if (reverse) parts = {Value::string(""), Value::string(""), Value::string(s)};
    else parts = {Value::string(s), Value::string(""), Value::string("")};
  } else {
    parts = {Value::string(s.substr(0, hit)), Value::string(sep), Value::string(s.substr(hit + sep.size()))};
  }
  return Value::sequence(std::move(parts), SequenceKind::kTuple);
}

template <bool (*Pred)(std::string_view)>
Value predicate(const Value& self, const CallArgs& args) {
  bind_args("is", args, {});
  return Value::boolean(Pred(self.as_string()));
}

template <std::string (*Fn)(std::string_view)>
Value transform(const Value& self, const CallArgs& args) {
  bind_args("str", args, {});
  return Value::string(Fn(self.as_string()));
}

// ---- str -----------------------------------------------------------------------------------

const std::unordered_map<std::string_view, MethodEntry>& str_methods() {
  constexpr MarkupRule kWrap = MarkupRule::kWrap;
  constexpr MarkupRule kEscapeSecond = MarkupRule::kEscapeSecond;
  constexpr MarkupRule kEscapeAll = MarkupRule::kEscapeAll;
  constexpr MarkupRule kEscapeItems = MarkupRule::kEscapeItems;
  static const std::unordered_map<std::string_view, MethodEntry> table = {
      {"startswith", {[](const Value& s, const CallArgs& a) { return affix_test(s, a, false); }}},
      {"endswith", {[](const Value& s, const CallArgs& a) { return affix_test(s, a, true); }}},
      {"find", {[](const Value& s, const CallArgs& a) { return find_impl(s, a, "find", false, false); }}},
      {"rfind", {[](const Value& s, const CallArgs& a) { return find_impl(s, a, "rfind", true, false); }}},
      {"index", {[](const Value& s, const CallArgs& a) { return find_impl(s, a, "index", false, true); }}},
      {"rindex", {[](const Value& s, const CallArgs& a) { return find_impl(s, a, "rindex", true, true); }}},
      {"count",
       {[](const Value& s, const CallArgs& args) {
         auto a = bind_args("count", args, {"sub", "start", "end"}, 1);
         const std::string& text = s.as_string();
         return Value::integer(py::count(text, required_str(a[0], "count"), bounds_of(text, a, 1, "count")));
       }}},
      {"strip", {[](const Value& s, const CallArgs& a) { return strip_impl(s, a, "strip", true, true); }, kWrap}},
      {"lstrip", {[](const Value& s, const CallArgs& a) { return strip_impl(s, a, "lstrip", true, false); }, kWrap}},
      {"rstrip", {[](const Value& s, const CallArgs& a) { return strip_impl(s, a, "rstrip", false, true); }, kWrap}},
      {"split", {[](const Value& s, const CallArgs& a) { return split_impl(s, a, "split", false); }, kWrap}},
      {"rsplit", {[](const Value& s, const CallArgs& a) { return split_impl(s, a, "rsplit", true); }, kWrap}},
      {"splitlines",
       {[](const Value& s, const CallArgs& args) {
          auto a = bind_args("splitlines", args, {"keepends"});
          return str_list(py::splitlines(s.as_string(), bool_arg(a[0], false)));
        },
        kWrap}},
      {"replace",
       {[](const Value& s, const CallArgs& args) {
          auto a = bind_args("replace", args, {"old", "new", "count"}, 2);
          return Value::string(py::replace(s.as_string(), required_str(a[0], "replace"), required_str(a[1], "replace"),
                                           int_arg(a[2], -1, "replace", "count")));
        },
        kEscapeSecond}},
      {"upper", {transform<py::upper>, kWrap}},
      {"lower", {transform<py::lower>, kWrap}},
      {"casefold", {transform<py::lower>, kWrap}},
      {"title", {transform<py::title>, kWrap}},
      {"capitalize", {transform<py::capitalize>, kWrap}},
      {"swapcase", {transform<py::swapcase>, kWrap}},
      {"isupper", {predicate<py::is_upper>}},
      {"islower", {predicate<py::is_lower>}},
      {"isdigit", {predicate<py::is_digit>}},
      {"isdecimal", {predicate<py::is_digit>}},
      {"isnumeric", {predicate<py::is_numeric>}},
      {"isalpha", {predicate<py::is_alpha>}},
      {"isalnum", {predicate<py::is_alnum>}},
      {"isspace", {predicate<py::is_space>}},
      {"format", {[](const Value& s, const CallArgs& a) { return Value::string(str_format(s.as_string(), a)); }, kEscapeAll}},
      {"join",
       {[](const Value& s, const CallArgs& args) {
          auto a = bind_args("join", args, {"iterable"}, 1);
          std::string out;
          size_t i = 0;
          for (const Value& item : iterate(*a[0])) {
            if (!item.is_string())
              runtime_error(fmt::format("sequence item {}: expected str instance, {} found", i, item.type_name()));
            if (i++) out += s.as_string();
            out += item.as_string();
          }
          return Value::string(std::move(out));
        },
        kEscapeItems}},
      {"removeprefix",
       {[](const Value& s, const CallArgs& args) {
         auto a = bind_args("removeprefix", args, {"prefix"}, 1);
         std::string p = required_str(a[0], "removeprefix");
         const std::string& t = s.as_string();
         return Value::string(t.compare(0, p.size(), p) == 0 ? t.substr(p.size()) : t);
       },
       kWrap}},
      {"removesuffix",
       {[](const Value& s, const CallArgs& args) {
         auto a = bind_args("removesuffix", args, {"suffix"}, 1);
         std::string p = required_str(a[0], "removesuffix");
         const std::string& t = s.as_string();
         bool hit = !p.empty() && t.size() >= p.size() && t.compare(t.size() - p.size(), p.size(), p) == 0;
         return Value::string(hit ? t.substr(0, t.size() - p.size()) : t);
       },
       kWrap}},
      {"partition", {[](const Value& s, const CallArgs& a) { return partition_impl(s, a, "partition", false); }, kWrap}},
      {"rpartition", {[](const Value& s, const CallArgs& a) { return partition_impl(s, a, "rpartition", true); }, kWrap}},
      {"center", {[](const Value& s, const CallArgs& a) { return justify(s, a, "center", '^'); }, kEscapeSecond}},
      {"ljust", {[](const Value& s, const CallArgs& a) { return justify(s, a, "ljust", '<'); }, kEscapeSecond}},
      {"rjust", {[](const Value& s, const CallArgs& a) { return justify(s, a, "rjust", '>'); }, kEscapeSecond}},
      {"zfill",
       {[](const Value& s, const CallArgs& args) {
          auto a = bind_args("zfill", args, {"width"}, 1);
          int64_t width = int_arg(a[0], 0, "zfill", "width");
          if (width > 100'000'000) limit_error("zfill width is too large");
          const std::string& t = s.as_string();
          int64_t len = static_cast<int64_t>(py::length(t));
          if (width <= len) return Value::string(t);
          size_t sign = (!t.empty() && (t[0] == '+' || t[0] == '-')) ? 1 : 0;
          return Value::string(t.substr(0, sign) + std::string(static_cast<size_t>(width - len), '0') + t.substr(sign));
        },
        kWrap}},
  };
  return table;
}

// ---- list / tuple / dict ------------------------------------------------------------------

const std::unordered_map<std::string_view, MethodEntry>& sequence_methods() {
  static const std::unordered_map<std::string_view, MethodEntry> table = {
      {"index",
       {[](const Value& self, const CallArgs& args) {
         auto a = bind_args("index", args, {"value"}, 1);
         const auto& items = self.items();
         for (size_t i = 0; i < items.size(); ++i)
           if (python_equals(items[i], *a[0])) return Value::integer(static_cast<int64_t>(i));
         runtime_error(fmt::format("{} is not in {}", to_repr(*a[0]), self.is_tuple() ? "tuple" : "list"));
       }}},
      {"count",
       {[](const Value& self, const CallArgs& args) {
         auto a = bind_args("count", args, {"value"}, 1);
         int64_t n = 0;
         for (const Value& v : self.items()) n += python_equals(v, *a[0]);
         return Value::integer(n);
       }}},
      {"copy",
       {[](const Value& self, const CallArgs& args) {
         bind_args("copy", args, {});
         return Value::sequence(self.items(), SequenceKind::kList);
       }}},
  };
  return table;
}

Value dict_view(const Dict& d, int which) {  // 0 keys, 1 values, 2 items
  std::vector<Value> out;
  out.reserve(d.size());
  for (const auto& [k, v] : d.entries()) {
    if (which == 0) out.push_back(k);
    else if (which == 1) out.push_back(v);
    else out.push_back(Value::sequence({k, v}, SequenceKind::kTuple));
  }
  return Value::sequence(std::move(out));
}

const std::unordered_map<std::string_view, MethodEntry>& dict_methods() {
  static const std::unordered_map<std::string_view, MethodEntry> table = {
      {"items",
       {[](const Value& self, const CallArgs& args) {
         bind_args("items", args, {});
         return dict_view(self.as_dict(), 2);
       }}},
      {"keys",
       {[](const Value& self, const CallArgs& args) {
         bind_args("keys", args, {});
         return dict_view(self.as_dict(), 0);
       }}},
      {"values",
       {[](const Value& self, const CallArgs& args) {
         bind_args("values", args, {});
         return dict_view(self.as_dict(), 1);
       }}},
      {"get",
       {[](const Value& self, const CallArgs& args) {
         auto a = bind_args("get", args, {"key", "default"}, 1);
         if (a[0]->is_dict() || a[0]->is_list()) runtime_error("unhashable type: '" + a[0]->type_name() + "'");
         if (const Value* v = self.as_dict().find(*a[0])) return *v;
         return a[1] ? *a[1] : Value::none();
       }}},
      {"copy",
       {[](const Value& self, const CallArgs& args) {
         bind_args("copy", args, {});
         return self;
       }}},
  };
  return table;
}

bool is_unsafe(const Value& receiver, std::string_view name) {
  static const std::unordered_set<std::string_view> kListMutators = {"append", "clear", "pop",  "reverse",
                                                                     "insert", "sort",  "extend", "remove"};
  static const std::unordered_set<std::string_view> kDictMutators = {"clear", "pop", "popitem", "setdefault",
                                                                     "update"};
  if (name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__") return true;
  if (receiver.is_list()) return kListMutators.count(name) > 0;
  if (receiver.is_dict()) return kDictMutators.count(name) > 0;
  return false;
}

}  // namespace

std::optional<Value> lookup_method(const Value& receiver, std::string_view name) {
  const std::unordered_map<std::string_view, MethodEntry>* table = nullptr;
  if (receiver.is_string()) {
    table = &str_methods();
  } else if (receiver.is_sequence() && receiver.as_sequence().kind != SequenceKind::kGenerator) {
    table = &sequence_methods();
  } else if (receiver.is_dict()) {
    table = &dict_methods();
  } else if (receiver.is_undefined() || receiver.is_object()) {
    return std::nullopt;
  }
  if (is_unsafe(receiver, name)) {
    std::string type = receiver.is_markup() ? "Markup" : receiver.type_name();
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type), true);
  }
  if (!table) return std::nullopt;
  auto it = table->find(name);
  if (it == table->end()) return std::nullopt;
  if (receiver.is_sequence() && receiver.as_sequence().kind != SequenceKind::kList && name == "copy")
    return std::nullopt;
  return Value::object(std::make_shared<BoundMethod>(receiver, std::string(name), it->second));
}

}  // namespace moeserve::text::jinja
