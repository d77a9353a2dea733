#include "text/jinja/string_format.h"

#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/operators.h"
#include "text/jinja/py_number.h"
#include "text/jinja/py_string.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {
namespace {

struct Spec {
  char32_t fill = ' ';
  char align = 0;  // '<', '>', '^', '=' or 0 (type default)
  char sign = '-';
  bool alternate = false;
  int64_t width = -1;
  char grouping = 0;  // ',' or '_'
  int64_t precision = -1;
  char type = 0;
};

std::string c_format(const char* fmt_with_star, int precision, double x) {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, fmt_with_star, precision, x);
  if (n < static_cast<int>(sizeof buf)) return std::string(buf, n > 0 ? n : 0);
  std::string big(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(big.data(), big.size(), fmt_with_star, precision, x);
  big.resize(static_cast<size_t>(n));
  return big;
}

void strip_trailing_zeros(std::string& s) {
  if (s.find('.') == std::string::npos) return;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
}

// 'g'-style formatting of |x| (no sign). none_type: Python's format type omitted with a
// precision (switches to exponent one digit earlier and keeps a ".0").
std::string format_general(double x, int64_t precision, bool alternate, bool none_type, bool upper) {
  int p = precision == 0 ? 1 : static_cast<int>(std::min<int64_t>(precision, 300));
  std::string sci = c_format("%.*e", p - 1, x);
  size_t e_pos = sci.find('e');
  int exp = std::atoi(sci.c_str() + e_pos + 1);
  int threshold = none_type ? p - 1 : p;
  std::string out;
  if (exp < -4 || exp >= threshold) {
    std::string mantissa = sci.substr(0, e_pos);
    if (!alternate) strip_trailing_zeros(mantissa);
    out = mantissa + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  } else {
    out = c_format("%.*f", p - 1 - exp, x);
    if (!alternate) strip_trailing_zeros(out);
    if (none_type && out.find('.') == std::string::npos) out += ".0";
  }
  if (upper)
    for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string group_digits(const std::string& digits, char separator, size_t every) {
  if (!separator) return digits;
  std::string out;
  size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i && (n - i) % every == 0) out.push_back(separator);
    out.push_back(digits[i]);
  }
  return out;
}

// Pads `sign + body` to the spec's width (counting code points).
std::string pad(const std::string& sign, const std::string& body, const Spec& spec, char default_align) {
  std::string out = sign + body;
  int64_t len = static_cast<int64_t>(py::length(out));
  if (spec.width <= len) return out;
  size_t fill_count = static_cast<size_t>(spec.width - len);
  std::string fill_char;
  py::append_utf8(fill_char, spec.fill);
  auto fill = [&](size_t n) {
    std::string f;
    for (size_t i = 0; i < n; ++i) f += fill_char;
    return f;
  };
  switch (spec.align ? spec.align : default_align) {
    case '<': return out + fill(fill_count);
    case '^': return fill(fill_count / 2) + out + fill(fill_count - fill_count / 2);
    case '=': return sign + fill(fill_count) + body;
    default: return fill(fill_count) + out;
  }
}

Spec parse_spec(const std::string& text) {
  Spec spec;
  std::u32string s = py::to_u32(text);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.align = static_cast<char>(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = static_cast<char>(s[0]);
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '#') {
    spec.alternate = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    if (!spec.align) {
      spec.fill = '0';
      spec.align = '=';
    }
    ++i;
  }
  auto read_number = [&]() {
    int64_t v = -1;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      v = (v < 0 ? 0 : v) * 10 + (s[i] - '0');
      if (v > 1'000'000) runtime_error("Too many decimal digits in format string");
      ++i;
    }
    return v;
  };
  spec.width = read_number();
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '.') {
    ++i;
    spec.precision = read_number();
    if (spec.precision < 0) runtime_error("Format specifier missing precision");
  }
  if (i < s.size()) spec.type = static_cast<char>(s[i++]);
  if (i != s.size()) runtime_error("Invalid format specifier");
  return spec;
}

std::string format_int(int64_t v, const Spec& spec) {
  if (spec.precision >= 0) runtime_error("Precision not allowed in integer format specifier");
  uint64_t magnitude = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits, prefix;
  size_t group_every = 3;
  switch (spec.type) {
    case 'b': digits = fmt::format("{:b}", magnitude); prefix = "0b"; group_every = 4; break;
    case 'o': digits = fmt::format("{:o}", magnitude); prefix = "0o"; group_every = 4; break;
    case 'x': digits = fmt::format("{:x}", magnitude); prefix = "0x"; group_every = 4; break;
    case 'X': digits = fmt::format("{:X}", magnitude); prefix = "0X"; group_every = 4; break;
    case 'c': {
      if (v < 0 || v > 0x10FFFF) runtime_error("%c arg not in range(0x110000)");
      std::string ch;
      py::append_utf8(ch, static_cast<char32_t>(v));
      return pad("", ch, spec, '<');
    }
    default: digits = std::to_string(magnitude); break;
  }
  digits = group_digits(digits, spec.grouping, group_every);
  std::string sign = v < 0 ? "-" : spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "";
  if (spec.alternate) sign += prefix;
  return pad(sign, digits, spec, '>');
}

std::string format_float(double v, const Spec& spec) {
  bool negative = std::signbit(v) && !std::isnan(v);
  double x = std::fabs(v);
  std::string body;
  char type = spec.type;
  bool upper = type == 'E' || type == 'F' || type == 'G';
  if (std::isnan(x) || std::isinf(x)) {
    body = std::isnan(x) ? "nan" : "inf";
    if (upper) body = std::isnan(x) ? "NAN" : "INF";
    if (type == '%') body += '%';
  } else {
    int64_t precision = spec.precision < 0 ? 6 : spec.precision;
    switch (type) {
      case 'e': case 'E': body = c_format(upper ? "%.*E" : "%.*e", static_cast<int>(precision), x); break;
      case 'f': case 'F': body = c_format("%.*f", static_cast<int>(precision), x); break;
      case '%': body = c_format("%.*f", static_cast<int>(precision), x * 100) + "%"; break;
      case 'g': case 'G': case 'n': body = format_general(x, precision, spec.alternate, false, upper); break;
      case 0:
        body = spec.precision < 0 ? py::float_repr(x) : format_general(x, spec.precision, spec.alternate, true, false);
        break;
      default:
        runtime_error(fmt::format("Unknown format code '{}' for object of type 'float'", type));
    }
    if (spec.grouping) {
      size_t int_end = body.find_first_not_of("0123456789");
      if (int_end == std::string::npos) int_end = body.size();
      body = group_digits(body.substr(0, int_end), spec.grouping, 3) + body.substr(int_end);
    }
  }
  std::string sign = negative ? "-" : spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "";
  return pad(sign, body, spec, '>');
}

// Arguments of a %-format: one value, a tuple, and/or a mapping for %(name)s.
class PercentArgs {
 public:
  explicit PercentArgs(const Value& args) : args_(args) {
    if (args.is_tuple()) {
      items_ = &args.items();
    } else if (args.is_dict()) {
      mapping_ = &args.as_dict();
    }
    // Python skips the "not all arguments converted" check for any single argument
    // with __getitem__ (dicts, but also lists).
    subscriptable_ = args.is_dict() || args.is_list();
  }
  const Value& next() {
    if (items_) {
      if (index_ >= items_->size()) runtime_error("not enough arguments for format string");
      return (*items_)[index_++];
    }
    if (index_ > 0) runtime_error("not enough arguments for format string");
    ++index_;
    return args_;
  }
  const Value& by_key(const std::string& key) {
    if (!mapping_) runtime_error("format requires a mapping");
    const Value* v = mapping_->find(std::string_view(key));
    if (!v) runtime_error("KeyError: " + py::repr(key));
    used_mapping_ = true;
    return *v;
  }
  void check_all_used() const {
    if (items_ && index_ < items_->size()) runtime_error("not all arguments converted during string formatting");
    if (!items_ && !subscriptable_ && index_ == 0)
      runtime_error("not all arguments converted during string formatting");
  }

 private:
  const Value& args_;
  const std::vector<Value>* items_ = nullptr;
  const Dict* mapping_ = nullptr;
  size_t index_ = 0;
  bool used_mapping_ = false;
  bool subscriptable_ = false;
};

int64_t percent_int(const Value& v, char conversion) {
  if (v.is_int() || v.is_bool()) return v.as_integer_like();
  if (v.is_float() && conversion != 'x' && conversion != 'X' && conversion != 'o' && conversion != 'c') {
    double f = v.as_float();
    if (!std::isfinite(f)) runtime_error("cannot convert float infinity or NaN to integer");
    return static_cast<int64_t>(std::trunc(f));
  }
  runtime_error(fmt::format("%{} format: a{} number is required, not {}", conversion,
                            conversion == 'd' || conversion == 'i' || conversion == 'u' ? " real" : "n integer",
                            v.type_name()));
}

}  // namespace

std::string format_value(const Value& value, const std::string& spec_text) {
  if (spec_text.empty()) return to_str(value);
  Spec spec = parse_spec(spec_text);
  if (value.is_string()) {
    if (spec.type && spec.type != 's')
      runtime_error(fmt::format("Unknown format code '{}' for object of type 'str'", spec.type));
    if (spec.sign != '-') runtime_error("Sign not allowed in string format specifier");
    if (spec.align == '=') runtime_error("'=' alignment not allowed in string format specifier");
    std::string s = value.as_string();
    if (spec.precision >= 0) s = py::substr(s, 0, spec.precision);
    return pad("", s, spec, '<');
  }
  if (value.is_int() || value.is_bool()) {
    if (std::string_view("eEfFgG%").find(spec.type) != std::string_view::npos && spec.type)
      return format_float(static_cast<double>(value.as_integer_like()), spec);
    if (spec.type && std::string_view("bcdoxXn").find(spec.type) == std::string_view::npos)
      runtime_error(fmt::format("Unknown format code '{}' for object of type 'int'", spec.type));
    return format_int(value.as_integer_like(), spec);
  }
  if (value.is_float()) return format_float(value.as_float(), spec);
  runtime_error(fmt::format("unsupported format string passed to {}.__format__", value.type_name()));
}

std::string percent_format(const std::string& format, const Value& args, bool escape_args) {
  PercentArgs values(args);
  std::string out;
  size_t i = 0;
  while (i < format.size()) {
    char c = format[i];
    if (c != '%') {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t start = i++;
    if (i >= format.size()) runtime_error("incomplete format");
    const Value* value = nullptr;
    if (format[i] == '(') {
      size_t close = format.find(')', i);
      if (close == std::string::npos) runtime_error("incomplete format key");
      value = &values.by_key(format.substr(i + 1, close - i - 1));
      i = close + 1;
    }
    Spec spec;
    spec.align = '>';
    bool left = false, zero = false;
    for (; i < format.size(); ++i) {
      char f = format[i];
      if (f == '-') left = true;
      else if (f == '+') spec.sign = '+';
      else if (f == ' ') { if (spec.sign != '+') spec.sign = ' '; }
      else if (f == '#') spec.alternate = true;
      else if (f == '0') zero = true;
      else break;
    }
    auto read_number = [&](int64_t& target) {
      if (i < format.size() && format[i] == '*') {
        const Value& w = values.next();
        if (!(w.is_int() || w.is_bool())) runtime_error("* wants int");
        target = w.as_integer_like();
        ++i;
        return;
      }
      int64_t v = -1;
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (format[i] - '0');
        if (v > 1'000'000) runtime_error("width too big");
        ++i;
      }
      target = v;
    };
    read_number(spec.width);
    if (spec.width < -1) {
      left = true;
      spec.width = -spec.width;
    }
    if (i < format.size() && format[i] == '.') {
      ++i;
      read_number(spec.precision);
      if (spec.precision < 0) spec.precision = 0;
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) runtime_error("incomplete format");
    char conversion = format[i++];
    if (conversion == '%') {
      out.push_back('%');
      continue;
    }
    if (!value) value = &values.next();
    if (left) spec.align = '<';
    else if (zero && std::string_view("diouxXeEfFgG").find(conversion) != std::string_view::npos) {
      spec.fill = '0';
      spec.align = '=';
    }
    switch (conversion) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conversion == 's' ? to_str(*value) : to_repr(*value);
        if (escape_args && !value->is_markup()) s = py::html_escape(s);
        if (spec.precision >= 0) s = py::substr(s, 0, spec.precision);
        Spec text_spec = spec;
        text_spec.fill = ' ';
        if (text_spec.align == '=') text_spec.align = '>';
        out += pad("", s, text_spec, '>');
        break;
      }
      case 'd': case 'i': case 'u': {
        Spec int_spec = spec;
        int_spec.precision = -1;
        std::string digits = format_int(percent_int(*value, conversion), int_spec);
        out += digits;
        break;
      }
      case 'x': case 'X': case 'o': {
        Spec int_spec = spec;
        int_spec.precision = -1;
        int_spec.type = conversion;
        out += format_int(percent_int(*value, conversion), int_spec);
        break;
      }
      case 'c': {
        std::string ch;
        if (value->is_string() && py::length(value->as_string()) == 1) ch = value->as_string();
        else py::append_utf8(ch, static_cast<char32_t>(percent_int(*value, 'c')));
        Spec text_spec = spec;
        text_spec.fill = ' ';
        out += pad("", ch, text_spec, '>');
        break;
      }
      case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
        if (!value->is_numeric())
          runtime_error(fmt::format("must be real number, not {}", value->type_name()));
        Spec float_spec = spec;
        float_spec.type = conversion;
        out += format_float(value->as_number(), float_spec);
        break;
      }
      default:
        runtime_error(fmt::format("unsupported format character '{}' (0x{:x}) at index {}", conversion,
                                  static_cast<unsigned char>(conversion), start + 1));
    }
  }
  values.check_all_used();
  return out;
}

std::string str_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  auto resolve = [&](const std::string& field) -> Value {
    size_t i = 0;
    while (i < field.size() && field[i] != '.' && field[i] != '[') ++i;
    std::string first = field.substr(0, i);
    Value obj;
    if (first.empty()) {
      if (used_manual) runtime_error("cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_index >= args.positional.size())
        runtime_error(fmt::format("Replacement index {} out of range for positional args tuple", auto_index));
      obj = args.positional[auto_index++];
    } else if (first.find_first_not_of("0123456789") == std::string::npos) {
      if (used_auto) runtime_error("cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      size_t index = std::stoul(first);
      if (index >= args.positional.size())
        runtime_error(fmt::format("Replacement index {} out of range for positional args tuple", index));
      obj = args.positional[index];
    } else {
      bool found = false;
      for (const auto& [k, v] : args.keywords)
        if (k == first) {
          obj = v;
          found = true;
        }
      if (!found) runtime_error("KeyError: " + py::repr(first));
    }
    while (i < field.size()) {
      if (field[i] == '.') {
        size_t j = i + 1;
        while (j < field.size() && field[j] != '.' && field[j] != '[') ++j;
        obj = get_attribute(obj, field.substr(i + 1, j - i - 1));
        i = j;
      } else {
        size_t close = field.find(']', i);
        if (close == std::string::npos) runtime_error("Missing ']' in format string");
        std::string key = field.substr(i + 1, close - i - 1);
        Value k = key.find_first_not_of("0123456789") == std::string::npos && !key.empty()
                      ? Value::integer(std::stoll(key))
                      : Value::string(key);
        obj = get_item(obj, k);
        i = close + 1;
      }
    }
    return obj;
  };

  size_t i = 0;
  while (i < format.size()) {
    char c = format[i];
    if (c == '{' && i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      runtime_error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    // {field!conv:spec}, the spec may hold one level of nested {fields}.
    size_t j = i + 1;
    int nesting = 1;
    while (j < format.size() && nesting > 0) {
      if (format[j] == '{') ++nesting;
      else if (format[j] == '}') --nesting;
      if (nesting > 0) ++j;
    }
    if (j >= format.size()) runtime_error("expected '}' before end of string");
    std::string inner = format.substr(i + 1, j - i - 1);
    i = j + 1;
    size_t colon = inner.find(':');
    size_t bang = inner.find('!');
    std::string field = inner.substr(0, std::min(colon, bang));
    char conversion = 0;
    if (bang != std::string::npos && bang < colon) {
      if (bang + 1 >= inner.size()) runtime_error("end of string while looking for conversion specifier");
      conversion = inner[bang + 1];
    }
    std::string spec = colon == std::string::npos ? "" : inner.substr(colon + 1);
    if (spec.find('{') != std::string::npos) spec = str_format(spec, args);
    Value v = resolve(field);
    if (conversion == 'r' || conversion == 'a') v = Value::string(to_repr(v));
    else if (conversion == 's') v = Value::string(to_str(v));
    else if (conversion) runtime_error(fmt::format("Unknown conversion specifier {}", conversion));
    out += format_value(v, spec);
  }
  return out;
}

}  // namespace moeserve::text::jinja
