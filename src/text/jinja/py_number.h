// Python number semantics: float repr, int/float arithmetic with Python's floor division
// and modulo signs, round(), and int()/float() parsing of strings.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::text::jinja::py {

// repr(float): the shortest string that round-trips, '1.0' for integral values, an
// exponent outside 1e-4 <= |x| < 1e16 ('1e+16', '1.5e-07'), 'inf', '-inf', 'nan'.
std::string float_repr(double x);

// Checked int64 arithmetic (Python ints are unbounded; we report overflow instead).
int64_t int_add(int64_t a, int64_t b);
int64_t int_sub(int64_t a, int64_t b);
int64_t int_mul(int64_t a, int64_t b);
int64_t int_floordiv(int64_t a, int64_t b);  // throws ZeroDivisionError-style errors
int64_t int_mod(int64_t a, int64_t b);
int64_t int_pow(int64_t base, int64_t exp);  // exp >= 0
double float_floordiv(double a, double b);
double float_mod(double a, double b);
double float_pow(double base, double exp);

// round(x, ndigits) for floats: correctly rounded, ties to even (like CPython).
double round_float(double x, int64_t ndigits);
// round(n, ndigits) for ints with negative ndigits (ties to even).
int64_t round_int(int64_t n, int64_t ndigits);

// int(s, base) and float(s); nullopt when Python would raise ValueError.
std::optional<int64_t> parse_int(std::string_view s, int base);
std::optional<double> parse_float(std::string_view s);

}  // namespace moeserve::text::jinja::py
