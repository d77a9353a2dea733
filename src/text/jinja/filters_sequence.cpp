// Sequence filters: selection, mapping, sorting, grouping, aggregation.
#include <algorithm>

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/filters_impl.h"
#include "text/jinja/operators.h"
#include "text/jinja/py_string.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja::filters {
namespace {

Value generator(std::vector<Value> items) { return Value::sequence(std::move(items), SequenceKind::kGenerator); }

Value lowercase_if_string(const Value& v) { return v.is_string() ? Value::string(py::lower(v.as_string())) : v; }

// select/reject/selectattr/rejectattr (jinja's select_or_reject).
Value select_or_reject(Interpreter& in, const Value& value, const CallArgs& args, bool keep_when,
                       bool lookup_attr, const char* fn) {
  std::vector<Value> out;
  if (!value.truthy()) return generator(std::move(out));
  size_t off = 0;
  std::function<Value(const Value&)> transform = [](const Value& x) { return x; };
  if (lookup_attr) {
    if (args.positional.empty()) runtime_error("Missing parameter for attribute name");
    transform = make_attrgetter(args.positional[0], false);
    off = 1;
  }
  std::optional<std::string> test_name;
  CallArgs test_args;
  if (args.positional.size() > off) {
    if (!args.positional[off].is_string())
      runtime_error(fmt::format("{}(): the test name must be a string", fn));
    test_name = args.positional[off].as_string();
    test_args.positional.assign(args.positional.begin() + static_cast<long>(off) + 1, args.positional.end());
    test_args.keywords = args.keywords;
  }
  for (const Value& item : iterate(value)) {
    Value subject = transform(item);
    bool passed = test_name ? in.call_test(*test_name, subject, test_args) : subject.truthy();
    if (passed == keep_when) out.push_back(item);
  }
  return generator(std::move(out));
}

// Stable sort of `items` by `key`, descending when `reverse` (stability kept like
// Python's sorted(reverse=True)).
void sort_by(std::vector<Value>& items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (Value& item : items) keyed.emplace_back(key(item), std::move(item));
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? less_than(b.first, a.first) : less_than(a.first, b.first);
  });
  items.clear();
  for (auto& kv : keyed) items.push_back(std::move(kv.second));
}

// jinja's make_multi_attrgetter: the sort key is always a list (of the comma-separated
// attributes' values), so equal keys compare equal before any '<' is tried.
std::function<Value(const Value&)> multi_attrgetter(const std::optional<Value>& attribute, bool ignore_case) {
  std::vector<std::function<Value(const Value&)>> getters;
  if (attribute && attribute->is_string()) {
    for (const auto& part : py::split(attribute->as_string(), std::string(","), -1))
      getters.push_back(make_attrgetter(Value::string(part), ignore_case));
  } else {
    getters.push_back(make_attrgetter(attribute, ignore_case));
  }
  return [getters](const Value& v) {
    std::vector<Value> keys;
    for (const auto& g : getters) keys.push_back(g(v));
    return Value::sequence(std::move(keys));
  };
}

Value min_or_max(const Value& value, const CallArgs& args, bool want_max, const char* fn) {
  auto a = bind_args(fn, args, {"case_sensitive", "attribute"});
  std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = make_attrgetter(a[1], !bool_arg(a[0], false));
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? less_than(best_key, k) : less_than(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

std::vector<Value> reversed_items(const Value& value) {
  if (value.is_undefined()) return {};
  if (value.is_dict() || (value.is_sequence() && value.as_sequence().kind != SequenceKind::kGenerator)) {
    std::vector<Value> items = iterate(value);
    std::reverse(items.begin(), items.end());
    return items;
  }
  runtime_error(fmt::format("'{}' object is not reversible", value.type_name()));
}

}  // namespace

Value batch(Interpreter&, const Value& value, const CallArgs& args) {
  auto a = bind_args("batch", args, {"linecount", "fill_with"}, 1);
  int64_t n = int_arg(a[0], 1, "batch", "linecount");
  if (n <= 0) runtime_error("batch(): linecount must be positive");
  std::vector<Value> out, current;
  for (const Value& item : iterate(value)) {
    if (static_cast<int64_t>(current.size()) == n) {
      out.push_back(Value::sequence(std::move(current)));
      current.clear();
    }
    current.push_back(item);
  }
  if (!current.empty()) {
    if (a[1] && !a[1]->is_none())
      while (static_cast<int64_t>(current.size()) < n) current.push_back(*a[1]);
    out.push_back(Value::sequence(std::move(current)));
  }
  return generator(std::move(out));
}

Value slice(Interpreter&, const Value& value, const CallArgs& args) {
  auto a = bind_args("slice", args, {"slices", "fill_with"}, 1);
  int64_t slices = int_arg(a[0], 1, "slice", "slices");
  if (slices <= 0) runtime_error("slice(): the number of slices must be positive");
  if (slices > 1'000'000) limit_error("slice(): too many slices");
  std::vector<Value> seq = iterate(value);
  int64_t length = static_cast<int64_t>(seq.size());
  int64_t per = length / slices, with_extra = length % slices, offset = 0;
  std::vector<Value> out;
  for (int64_t k = 0; k < slices; ++k) {
    int64_t start = offset + k * per;
    if (k < with_extra) ++offset;
    int64_t end = offset + (k + 1) * per;
    std::vector<Value> part(seq.begin() + start, seq.begin() + end);
    if (a[1] && !a[1]->is_none() && k >= with_extra) part.push_back(*a[1]);
    out.push_back(Value::sequence(std::move(part)));
  }
  return generator(std::move(out));
}

Value dictsort(Interpreter&, const Value& value, const CallArgs& args) {
  auto a = bind_args("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!value.is_dict()) runtime_error(fmt::format("dictsort expects a dict, not {}", value.type_name()));
  std::string by = string_arg(a[1], "key", "dictsort", "by");
  if (by != "key" && by != "value") runtime_error("You can only sort by either \"key\" or \"value\"");
  bool case_sensitive = bool_arg(a[0], false);
  std::vector<Value> pairs;
  for (const auto& [k, v] : value.as_dict().entries()) pairs.push_back(Value::sequence({k, v}, SequenceKind::kTuple));
  size_t pos = by == "key" ? 0 : 1;
  sort_by(pairs, [&](const Value& pair) {
    const Value& x = pair.items()[pos];
    return case_sensitive ? x : lowercase_if_string(x);
  }, bool_arg(a[2], false));
  return Value::sequence(std::move(pairs));
}

Value first(Interpreter&, const Value& value, const CallArgs& args) {
  bind_args("first", args, {});
  std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value last(Interpreter&, const Value& value, const CallArgs& args) {
  bind_args("last", args, {});
  if (value.is_string()) {
    std::vector<Value> chars = iterate(value);
    if (chars.empty()) return Value::undefined("No last item, sequence was empty.");
    return chars.back();
  }
  std::vector<Value> items = reversed_items(value);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.front();
}

Value groupby(Interpreter&, const Value& value, const CallArgs& args) {
  auto a = bind_args("groupby", args, {"attribute", "default", "case_sensitive"}, 1);
  bool case_sensitive = bool_arg(a[2], false);
  std::optional<Value> fallback = a[1] && !a[1]->is_none() ? a[1] : std::nullopt;
  auto key = make_attrgetter(a[0], !case_sensitive, fallback);
  auto output_key = make_attrgetter(a[0], false, fallback);
  std::vector<Value> items = iterate(value);
  sort_by(items, key, false);
  std::vector<Value> groups;
  size_t i = 0;
  while (i < items.size()) {
    Value k = key(items[i]);
    std::vector<Value> members;
    size_t j = i;
    while (j < items.size() && python_equals(key(items[j]), k)) members.push_back(items[j++]);
    Value group_key = case_sensitive ? k : output_key(members.front());
    groups.push_back(Value::sequence({group_key, Value::sequence(std::move(members))}, SequenceKind::kTuple));
    i = j;
  }
  return Value::sequence(std::move(groups));
}

Value items(Interpreter&, const Value& value, const CallArgs& args) {
  bind_args("items", args, {});
  if (value.is_undefined()) return generator({});
  if (!value.is_dict()) runtime_error("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, v] : value.as_dict().entries()) out.push_back(Value::sequence({k, v}, SequenceKind::kTuple));
  return generator(std::move(out));
}

Value join(Interpreter& in, const Value& value, const CallArgs& args) {
  auto a = bind_args("join", args, {"d", "attribute"});
  std::string separator = a[0] ? to_str(*a[0]) : "";
  auto getter = make_attrgetter(a[1], false);
  std::string out;
  bool first_item = true;
  for (const Value& item : iterate(value)) {
    if (!first_item) out += separator;
    first_item = false;
    Value v = a[1] && !a[1]->is_none() ? getter(item) : item;
    out += v.is_string() ? v.as_string() : to_str(v);
    in.check_string_size(out.size());
  }
  return Value::string(std::move(out));
}

Value list(Interpreter&, const Value& value, const CallArgs& args) {
  bind_args("list", args, {});
  return Value::sequence(iterate(value));
}

Value map(Interpreter& in, const Value& value, const CallArgs& args) {
  std::vector<Value> out;
  if (!value.truthy()) return generator(std::move(out));
  std::function<Value(const Value&)> fn;
  bool has_attribute =
      std::any_of(args.keywords.begin(), args.keywords.end(), [](const auto& kv) { return kv.first == "attribute"; });
  if (args.positional.empty() && has_attribute) {
    std::optional<Value> attribute, fallback;
    for (const auto& [k, v] : args.keywords) {
      if (k == "attribute") attribute = v;
      else if (k == "default") fallback = v;
      else runtime_error(fmt::format("Unexpected keyword argument '{}'", k));
    }
    fn = make_attrgetter(attribute, false, fallback && !fallback->is_none() ? fallback : std::nullopt);
  } else {
    if (args.positional.empty()) runtime_error("map requires a filter argument");
    if (!args.positional[0].is_string()) runtime_error("map(): the filter name must be a string");
    std::string name = args.positional[0].as_string();
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keywords = args.keywords;
    fn = [&in, name, rest](const Value& item) { return in.call_filter(name, item, rest); };
  }
  for (const Value& item : iterate(value)) out.push_back(fn(item));
  return generator(std::move(out));
}

Value max(Interpreter&, const Value& value, const CallArgs& args) { return min_or_max(value, args, true, "max"); }
Value min(Interpreter&, const Value& value, const CallArgs& args) { return min_or_max(value, args, false, "min"); }

Value select(Interpreter& in, const Value& v, const CallArgs& a) { return select_or_reject(in, v, a, true, false, "select"); }
Value reject(Interpreter& in, const Value& v, const CallArgs& a) { return select_or_reject(in, v, a, false, false, "reject"); }
Value selectattr(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_or_reject(in, v, a, true, true, "selectattr");
}
Value rejectattr(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_or_reject(in, v, a, false, true, "rejectattr");
}

Value reverse(Interpreter&, const Value& value, const CallArgs& args) {
  bind_args("reverse", args, {});
  if (value.is_string()) {
    std::u32string chars = py::to_u32(value.as_string());
    std::reverse(chars.begin(), chars.end());
    return Value::string(py::to_utf8(chars), value.is_markup());
  }
  if (value.is_sequence() && value.as_sequence().kind == SequenceKind::kGenerator) {
    std::vector<Value> items = value.items();
    std::reverse(items.begin(), items.end());
    return Value::sequence(std::move(items));
  }
  if (!(value.is_undefined() || value.is_dict() || value.is_sequence())) runtime_error("argument must be iterable");
  return generator(reversed_items(value));
}

Value sort(Interpreter&, const Value& value, const CallArgs& args) {
  auto a = bind_args("sort", args, {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = iterate(value);
  sort_by(items, multi_attrgetter(a[2], !bool_arg(a[1], false)), bool_arg(a[0], false));
  return Value::sequence(std::move(items));
}

Value sum(Interpreter& in, const Value& value, const CallArgs& args) {
  auto a = bind_args("sum", args, {"attribute", "start"});
  auto getter = make_attrgetter(a[0], false);
  Value total = a[1] ? *a[1] : Value::integer(0);
  for (const Value& item : iterate(value)) total = binary_op(BinaryOp::kAdd, total, getter(item), in.limits().max_output_bytes);
  return total;
}

Value unique(Interpreter&, const Value& value, const CallArgs& args) {
  auto a = bind_args("unique", args, {"case_sensitive", "attribute"});
  auto key = make_attrgetter(a[1], !bool_arg(a[0], false));
  std::vector<Value> seen, out;
  for (const Value& item : iterate(value)) {
    Value k = key(item);
    if (k.is_dict() || k.is_list()) runtime_error(fmt::format("unhashable type: '{}'", k.type_name()));
    bool duplicate = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return python_equals(s, k); });
    if (duplicate) continue;
    seen.push_back(std::move(k));
    out.push_back(item);
  }
  return generator(std::move(out));
}

}  // namespace moeserve::text::jinja::filters
