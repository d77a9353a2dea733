// String filters: case, whitespace, escaping, formatting, indentation.
#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/filters_impl.h"
#include "text/jinja/operators.h"
#include "text/jinja/py_string.h"
#include "text/jinja/string_format.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja::filters {
namespace {

Value same_kind(std::string text, const Value& like) { return Value::string(std::move(text), like.is_markup()); }

// jinja's _word_beginning_split_re separators: [-\s({\[<]
bool is_title_separator(char32_t c) {
  return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_whitespace(c);
}

bool is_word_char(char32_t c) {
  std::string s;
  py::append_utf8(s, c);
  return c == '_' || py::is_alnum(s);
}

// Replaces the HTML entities markupsafe's unescape() knows best (named basics, numeric).
std::string html_unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '&') {
      out.push_back(s[i++]);
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string_view::npos || semi - i > 12) {
      out.push_back(s[i++]);
      continue;
    }
    std::string_view entity = s.substr(i + 1, semi - i - 1);
    std::string replacement;
    if (entity == "amp") replacement = "&";
    else if (entity == "lt") replacement = "<";
    else if (entity == "gt") replacement = ">";
    else if (entity == "quot") replacement = "\"";
    else if (entity == "apos") replacement = "'";
    else if (entity == "nbsp") py::append_utf8(replacement, 0xA0);
    else if (entity.size() > 1 && entity[0] == '#') {
      bool hex = entity[1] == 'x' || entity[1] == 'X';
      std::string digits(entity.substr(hex ? 2 : 1));
      char* end = nullptr;
      unsigned long cp = digits.empty() ? 0 : std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
      if (!digits.empty() && end && *end == '\0' && cp > 0 && cp <= 0x10FFFF) py::append_utf8(replacement, static_cast<char32_t>(cp));
    }
    if (replacement.empty()) {
      out.push_back(s[i++]);
      continue;
    }
    out += replacement;
    i = semi + 1;
  }
  return out;
}

}  // namespace

Value capitalize(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("capitalize", args, {});
  Value s = soft_str(v);
  return same_kind(py::capitalize(s.as_string()), s);
}

Value upper(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("upper", args, {});
  Value s = soft_str(v);
  return same_kind(py::upper(s.as_string()), s);
}

Value lower(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("lower", args, {});
  Value s = soft_str(v);
  return same_kind(py::lower(s.as_string()), s);
}

Value title(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("title", args, {});
  std::u32string text = py::to_u32(soft_str(v).as_string());
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    bool sep = is_title_separator(text[i]);
    size_t j = i;
    while (j < text.size() && is_title_separator(text[j]) == sep) ++j;
    std::u32string_view segment = std::u32string_view(text).substr(i, j - i);
    out += py::upper(py::to_utf8(segment.substr(0, 1)));
    out += py::lower(py::to_utf8(segment.substr(1)));
    i = j;
  }
  return Value::string(std::move(out));
}

Value center(Interpreter&, const Value& v, const CallArgs& args) {
  auto a = bind_args("center", args, {"width"});
  int64_t width = int_arg(a[0], 80, "center", "width");
  Value s = soft_str(v);
  int64_t len = static_cast<int64_t>(py::length(s.as_string()));
  if (width > 100'000'000) limit_error("center width is too large");
  if (width <= len) return s;
  int64_t margin = width - len;
  int64_t left = margin / 2 + (margin & width & 1);
  return same_kind(std::string(static_cast<size_t>(left), ' ') + s.as_string() +
                       std::string(static_cast<size_t>(margin - left), ' '),
                   s);
}

Value escape(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("escape", args, {});
  if (v.is_markup()) return v;
  return Value::string(py::html_escape(to_str(v)), true);
}

Value forceescape(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("forceescape", args, {});
  return Value::string(py::html_escape(to_str(v)), true);
}

Value safe(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("safe", args, {});
  return Value::string(v.is_string() ? v.as_string() : to_str(v), true);
}

Value string(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("string", args, {});
  return soft_str(v);
}

Value format(Interpreter&, const Value& v, const CallArgs& args) {
  if (!args.positional.empty() && !args.keywords.empty())
    runtime_error("can't handle positional and keyword arguments at the same time");
  Value s = soft_str(v);
  Value values;
  if (!args.keywords.empty()) {
    auto d = std::make_shared<Dict>();
    for (const auto& [k, val] : args.keywords) d->set(Value::string(k), val);
    values = Value::dict(std::move(d));
  } else {
    values = Value::sequence(args.positional, SequenceKind::kTuple);
  }
  return same_kind(percent_format(s.as_string(), values, s.is_markup()), s);
}

Value indent(Interpreter& in, const Value& v, const CallArgs& args) {
  auto a = bind_args("indent", args, {"width", "first", "blank"});
  std::string indention;
  if (a[0] && a[0]->is_string()) {
    indention = a[0]->as_string();
  } else {
    int64_t width = int_arg(a[0], 4, "indent", "width");
    if (width > 100'000) limit_error("indent width is too large");
    indention = std::string(width > 0 ? static_cast<size_t>(width) : 0, ' ');
  }
  if (!v.is_string()) runtime_error(fmt::format("indent expects a str, not {}", v.type_name()));
  std::vector<std::string> lines = py::splitlines(v.as_string() + "\n", false);
  std::string rv;
  if (bool_arg(a[2], false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (bool_arg(a[1], false)) rv = indention + rv;
  in.check_string_size(rv.size());
  return same_kind(std::move(rv), v);
}

Value replace(Interpreter& in, const Value& v, const CallArgs& args) {
  auto a = bind_args("replace", args, {"old", "new", "count"}, 2);
  int64_t count = a[2] && !a[2]->is_none() ? int_arg(a[2], -1, "replace", "count") : -1;
  std::string out = py::replace(to_str(v), to_str(*a[0]), to_str(*a[1]), count);
  in.check_string_size(out.size());
  return Value::string(std::move(out));
}

Value striptags(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("striptags", args, {});
  std::string text = to_str(v);
  for (size_t start; (start = text.find("<!--")) != std::string::npos;) {
    size_t end = text.find("-->", start);
    if (end == std::string::npos) break;
    text.erase(start, end + 3 - start);
  }
  for (size_t start; (start = text.find('<')) != std::string::npos;) {
    size_t end = text.find('>', start);
    if (end == std::string::npos) break;
    text.erase(start, end + 1 - start);
  }
  std::string joined;
  for (const auto& word : py::split(text, std::nullopt, -1)) {
    if (!joined.empty()) joined += ' ';
    joined += word;
  }
  return Value::string(html_unescape(joined));
}

Value trim(Interpreter&, const Value& v, const CallArgs& args) {
  auto a = bind_args("trim", args, {"chars"});
  Value s = soft_str(v);
  std::optional<std::string> chars = optional_string_arg(a[0], "trim", "chars");
  return same_kind(py::strip(s.as_string(), chars, true, true), s);
}

Value truncate(Interpreter&, const Value& v, const CallArgs& args) {
  auto a = bind_args("truncate", args, {"length", "killwords", "end", "leeway"});
  int64_t max_length = int_arg(a[0], 255, "truncate", "length");
  bool killwords = bool_arg(a[1], false);
  std::string end = a[2] ? to_str(*a[2]) : "...";
  int64_t leeway = a[3] && !a[3]->is_none() ? int_arg(a[3], 5, "truncate", "leeway") : 5;
  int64_t end_len = static_cast<int64_t>(py::length(end));
  if (max_length < end_len) runtime_error(fmt::format("expected length >= {}, got {}", end_len, max_length));
  if (leeway < 0) runtime_error(fmt::format("expected leeway >= 0, got {}", leeway));
  if (!v.is_string()) {
    // Python slices any sequence; only the "fits already" case makes sense for non-str.
    if (jinja::length(v) <= max_length + leeway) return v;
    runtime_error(fmt::format("truncate expects a str, not {}", v.type_name()));
  }
  const std::string& s = v.as_string();
  if (static_cast<int64_t>(py::length(s)) <= max_length + leeway) return v;
  std::string head = py::substr(s, 0, max_length - end_len);
  if (killwords) return Value::string(head + end);
  std::vector<std::string> parts = py::rsplit(head, std::string(" "), 1);
  return Value::string(parts[0] + end);
}

Value wordcount(Interpreter&, const Value& v, const CallArgs& args) {
  bind_args("wordcount", args, {});
  std::string text = to_str(v);
  int64_t words = 0;
  bool in_word = false;
  size_t pos = 0;
  while (pos < text.size()) {
    bool w = is_word_char(py::decode_utf8(text, pos));
    if (w && !in_word) ++words;
    in_word = w;
  }
  return Value::integer(words);
}

}  // namespace moeserve::text::jinja::filters
