// Python str semantics on UTF-8 std::strings: lengths and indices count code points,
// whitespace and case follow Unicode (via utf8proc), and the algorithms (split, strip,
// title, find, ...) match CPython's. Invalid UTF-8 bytes decode as U+FFFD, never read
// out of bounds.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/unicode.h"

namespace moeserve::text::jinja::py {

// Decodes one code point at `pos`, advancing it. Invalid sequences give U+FFFD and
// advance one byte.
char32_t decode_utf8(std::string_view s, size_t& pos);
std::u32string to_u32(std::string_view s);
using text::append_utf8;  // unicode.h
std::string to_utf8(std::u32string_view s);
bool is_valid_utf8(std::string_view s);
bool is_ascii(std::string_view s);
// len(s).
size_t length(std::string_view s);

bool is_whitespace(char32_t c);  // str.isspace() for one character
bool is_line_break(char32_t c);  // what str.splitlines() splits on
bool is_printable(char32_t c);   // str.isprintable() for one character (repr escapes the rest)

// Methods of str. `chars` = nullopt means "whitespace".
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string swapcase(std::string_view s);
bool is_upper(std::string_view s);
bool is_lower(std::string_view s);
bool is_digit(std::string_view s);
bool is_alpha(std::string_view s);
bool is_alnum(std::string_view s);
bool is_space(std::string_view s);
bool is_numeric(std::string_view s);

// Resolves Python's optional [start:end] bounds of find/count/startswith to code point
// indices into a string of `len` code points (clamped, negatives from the end).
struct Bounds {
  int64_t start;
  int64_t end;
};
Bounds resolve_bounds(std::optional<int64_t> start, std::optional<int64_t> end, int64_t len);
// find/rfind in code points, -1 when absent, within [start, end) code points.
int64_t find(std::string_view s, std::string_view sub, Bounds b, bool reverse);
int64_t count(std::string_view s, std::string_view sub, Bounds b);
// The substring of code points [start, end).
std::string substr(std::string_view s, int64_t start, int64_t end);

// Python slice indices for a sequence of `len` items: start/stop/step as given (nullopt
// = omitted); returns the selected indices. step must be non-zero.
std::vector<int64_t> slice_indices(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   int64_t step);
// The adjusted (start, stop) of slice.indices(len).
std::pair<int64_t, int64_t> slice_bounds(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                                         int64_t step);

// repr() of a str, e.g. 'it\'s' -> "it's".
std::string repr(std::string_view s);
// markupsafe.escape(): & < > " ' as HTML entities.
std::string html_escape(std::string_view s);

}  // namespace moeserve::text::jinja::py
