#include "text/jinja/value_format.h"

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/py_number.h"
#include "text/jinja/py_string.h"

namespace moeserve::text::jinja {
namespace {

void append_repr(std::string& out, const Value& v, int depth);

void append_sequence_repr(std::string& out, const Sequence& seq, int depth) {
  if (seq.kind == SequenceKind::kGenerator) {
    out += "<generator object>";
    return;
  }
  if (seq.kind == SequenceKind::kRange) {
    out += fmt::format("range({}, {}", seq.range_start, seq.range_stop);
    if (seq.range_step != 1) out += fmt::format(", {}", seq.range_step);
    out += ')';
    return;
  }
  bool tuple = seq.kind == SequenceKind::kTuple;
  out += tuple ? '(' : '[';
  for (size_t i = 0; i < seq.items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, seq.items[i], depth + 1);
  }
  if (tuple && seq.items.size() == 1) out += ',';
  out += tuple ? ')' : ']';
}

void append_dict_repr(std::string& out, const Dict& d, int depth) {
  out += '{';
  bool first = true;
  for (const auto& [key, value] : d.entries()) {
    if (!first) out += ", ";
    first = false;
    append_repr(out, key, depth + 1);
    out += ": ";
    append_repr(out, value, depth + 1);
  }
  out += '}';
}

void append_repr(std::string& out, const Value& v, int depth) {
  if (depth > kMaxNestingDepth) runtime_error("maximum recursion depth exceeded while getting the repr of an object");
  switch (v.kind()) {
    case Kind::kUndefined: out += "Undefined"; return;
    case Kind::kString:
      if (v.is_markup()) {
        out += "Markup(";
        out += py::repr(v.as_string());
        out += ')';
      } else {
        out += py::repr(v.as_string());
      }
      return;
    case Kind::kSequence: append_sequence_repr(out, v.as_sequence(), depth); return;
    case Kind::kDict: append_dict_repr(out, v.as_dict(), depth); return;
    default: out += to_str(v); return;
  }
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return {};
    case Kind::kNone: return "None";
    case Kind::kBool: return v.as_bool() ? "True" : "False";
    case Kind::kInt: return std::to_string(v.as_int());
    case Kind::kFloat: return py::float_repr(v.as_float());
    case Kind::kString: return v.as_string();
    case Kind::kSequence:
    case Kind::kDict: return to_repr(v);
    case Kind::kObject: return v.as_object().repr();
  }
  return {};
}

std::string to_repr(const Value& v) {
  std::string out;
  append_repr(out, v, 0);
  return out;
}

}  // namespace moeserve::text::jinja
