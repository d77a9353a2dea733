#include "text/jinja/py_number.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "text/jinja/error.h"
#include "text/jinja/py_string.h"

namespace moeserve::text::jinja::py {
namespace {

[[noreturn]] void overflow() { runtime_error("integer overflow: the result does not fit in 64 bits"); }

// Strips Python whitespace from both ends (int() and float() accept it).
std::string_view trim_ws(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && static_cast<unsigned char>(s[b]) < 0x80 && is_whitespace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && static_cast<unsigned char>(s[e - 1]) < 0x80 && is_whitespace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return s.substr(b, e - b);
}

// Removes '_' between digits; nullopt when an underscore is misplaced.
std::optional<std::string> remove_digit_separators(std::string_view s, int base) {
  auto is_digit_of_base = [base](char c) {
    int v = -1;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'Z') v = c - 'A' + 10;
    return v >= 0 && v < base;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !is_digit_of_base(s[i - 1]) || !is_digit_of_base(s[i + 1]))
        return std::nullopt;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);  // e.g. "-1.2345e-07"
  bool negative = !sci.empty() && sci[0] == '-';
  if (negative) sci.remove_prefix(1);
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits.push_back(c);
  int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  int decpt = exponent + 1;  // position of the decimal point relative to the digits
  int n = static_cast<int>(digits.size());
  std::string out = negative ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out += digits.substr(1);
    }
    int e = decpt - 1;
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    out += ebuf;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= n) {
    out += digits;
    out.append(static_cast<size_t>(decpt - n), '0');
    out += ".0";
  } else {
    out += digits.substr(0, decpt);
    out += '.';
    out += digits.substr(decpt);
  }
  return out;
}

int64_t int_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}

int64_t int_sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}

int64_t int_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

int64_t int_floordiv(int64_t a, int64_t b) {
  if (b == 0) runtime_error("integer division or modulo by zero");
  if (a == std::numeric_limits<int64_t>::min() && b == -1) overflow();
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t int_mod(int64_t a, int64_t b) {
  if (b == 0) runtime_error("integer modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

int64_t int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) result = int_mul(result, base);
    exp >>= 1;
    if (exp > 0) base = int_mul(base, base);
  }
  return result;
}

double float_floordiv(double a, double b) {
  if (b == 0.0) runtime_error("float floor division by zero");
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) div -= 1.0;
  }
  double floordiv;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return floordiv;
}

double float_mod(double a, double b) {
  if (b == 0.0) runtime_error("float modulo");
  double mod = std::fmod(a, b);
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = std::copysign(0.0, b);
  }
  return mod;
}

double float_pow(double base, double exp) {
  if (base == 0.0 && exp < 0) runtime_error("0.0 cannot be raised to a negative power");
  if (base < 0 && std::isfinite(exp) && exp != std::floor(exp))
    runtime_error("a negative number raised to a fractional power is complex, which templates do not support");
  double r = std::pow(base, exp);
  if (std::isinf(r) && std::isfinite(base) && std::isfinite(exp)) runtime_error("(34, 'Numerical result out of range')");
  return r;
}

double round_float(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits > 323) return x;
  if (ndigits < -308) return 0.0 * x;
  if (ndigits >= 0) {
    // glibc's printf rounds the exact binary value correctly, ties to even: the same
    // decimal CPython's round() computes with dtoa.
    char buf[800];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  double scale = std::pow(10.0, static_cast<double>(-ndigits));
  double y = std::nearbyint(x / scale) * scale;
  return std::isfinite(y) ? y : x;
}

int64_t round_int(int64_t n, int64_t ndigits) {
  if (ndigits >= 0) return n;
  if (ndigits < -18) return 0;
  int64_t p = int_pow(10, -ndigits);
  int64_t q = int_floordiv(n, p);
  int64_t r = int_mod(n, p);
  if (2 * r > p || (2 * r == p && (q & 1))) ++q;
  return int_mul(q, p);
}

std::optional<int64_t> parse_int(std::string_view text, int base) {
  std::string_view s = trim_ws(text);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  auto has_prefix = [&](char lower) {
    return s.size() >= 2 && s[0] == '0' && (s[1] == lower || s[1] == lower - 32);
  };
  if (base == 0) {
    if (has_prefix('x')) base = 16;
    else if (has_prefix('o')) base = 8;
    else if (has_prefix('b')) base = 2;
    else base = 10;
    if (base == 10 && s.size() > 1 && s[0] == '0' && s.find_first_not_of("0_") != std::string_view::npos)
      return std::nullopt;  // "012" is invalid with base 0
  }
  if ((base == 16 && has_prefix('x')) || (base == 8 && has_prefix('o')) || (base == 2 && has_prefix('b'))) {
    s.remove_prefix(2);
    if (!s.empty() && s[0] == '_') s.remove_prefix(1);
  }
  if (s.empty() || base < 2 || base > 36) return std::nullopt;
  auto digits = remove_digit_separators(s, base);
  if (!digits || digits->empty()) return std::nullopt;
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(digits->data(), digits->data() + digits->size(), value, base);
  if (ec != std::errc() || ptr != digits->data() + digits->size()) return std::nullopt;
  if (negative) {
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1) return std::nullopt;
    return static_cast<int64_t>(0 - value);
  }
  if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(value);
}

std::optional<double> parse_float(std::string_view text) {
  std::string_view s = trim_ws(text);
  std::string lowered;
  for (char c : s) lowered.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
  std::string_view body = lowered;
  bool negative = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") return negative ? -INFINITY : INFINITY;
  if (body == "nan") return NAN;
  // [digits][.digits][e[sign]digits] with at least one mantissa digit.
  size_t i = 0;
  auto digits = [&]() {
    size_t start = i;
    while (i < body.size() && ((body[i] >= '0' && body[i] <= '9') || body[i] == '_')) ++i;
    return i - start;
  };
  size_t int_digits = digits();
  size_t frac_digits = 0;
  if (i < body.size() && body[i] == '.') {
    ++i;
    frac_digits = digits();
  }
  if (int_digits + frac_digits == 0) return std::nullopt;
  if (i < body.size() && body[i] == 'e') {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != body.size()) return std::nullopt;
  // Underscores must sit between digits.
  for (size_t k = 0; k < body.size(); ++k) {
    if (body[k] != '_') continue;
    bool ok = k > 0 && k + 1 < body.size() && std::isdigit(static_cast<unsigned char>(body[k - 1])) &&
              std::isdigit(static_cast<unsigned char>(body[k + 1]));
    if (!ok) return std::nullopt;
  }
  std::string clean;
  for (char c : body)
    if (c != '_') clean.push_back(c);
  double v = std::strtod(clean.c_str(), nullptr);
  return negative ? -v : v;
}

}  // namespace moeserve::text::jinja::py
