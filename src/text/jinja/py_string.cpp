#include "text/jinja/py_string.h"

#include <utf8proc.h>

#include <algorithm>

#include <fmt/format.h>

#include "text/jinja/error.h"

namespace moeserve::text::jinja::py {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

utf8proc_category_t category(char32_t c) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}

bool is_cased(char32_t c) {
  auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool is_upper_char(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LU; }
bool is_lower_char(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LL; }
bool is_alpha_char(char32_t c) {
  auto cat = category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool is_decimal_char(char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; }
bool is_numeric_char(char32_t c) {
  auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

// Case mappings. utf8proc has the simple (1:1) mappings; the few full mappings that
// change the length and that real text hits are special-cased like CPython does.
void append_upper(std::string& out, char32_t c) {
  if (c == 0xDF) {  // ß -> SS
    out += "SS";
    return;
  }
  append_utf8(out, static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))));
}
void append_lower(std::string& out, char32_t c) {
  if (c == 0x130) {  // İ -> i + combining dot above
    out += "i";
    append_utf8(out, 0x307);
    return;
  }
  append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}
void append_title(std::string& out, char32_t c) {
  if (c == 0xDF) {  // ß -> Ss
    out += "Ss";
    return;
  }
  append_utf8(out, static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))));
}

template <typename Pred>
bool all_chars(std::string_view s, Pred pred) {
  if (s.empty()) return false;
  size_t pos = 0;
  while (pos < s.size())
    if (!pred(decode_utf8(s, pos))) return false;
  return true;
}

bool in_set(const std::u32string& set, char32_t c) { return set.find(c) != std::u32string::npos; }

}  // namespace

// ---- UTF-8 ------------------------------------------------------------------------

char32_t decode_utf8(std::string_view s, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char b0 = byte(pos);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  int extra;
  char32_t cp;
  char32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    extra = 1, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    extra = 2, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    extra = 3, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++pos;
    return kReplacement;
  }
  if (pos + static_cast<size_t>(extra) >= s.size()) {  // truncated sequence
    ++pos;
    return kReplacement;
  }
  for (int i = 1; i <= extra; ++i) {
    unsigned char b = byte(pos + i);
    if ((b & 0xC0) != 0x80) {
      ++pos;
      return kReplacement;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++pos;
    return kReplacement;
  }
  pos += extra + 1;
  return cp;
}

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) out.push_back(decode_utf8(s, pos));
  return out;
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_valid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t before = pos;
    char32_t c = decode_utf8(s, pos);
    if (c == kReplacement && !(pos - before == 3 && s.substr(before, 3) == "\xEF\xBF\xBD")) return false;
  }
  return true;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0, pos = 0;
  while (pos < s.size()) {
    decode_utf8(s, pos);
    ++n;
  }
  return n;
}

// ---- character classes --------------------------------------------------------------

bool is_whitespace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_line_break(char32_t c) {
  switch (c) {
    case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x85: case 0x2028:
    case 0x2029:
      return true;
    default:
      return false;
  }
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

// ---- str methods ----------------------------------------------------------------------

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  if (!chars) {
    // Whitespace: walk the UTF-8 bytes from both ends without decoding the middle.
    size_t begin = 0, end = s.size();
    if (left) {
      while (begin < end) {
        size_t next = begin;
        if (!is_whitespace(decode_utf8(s, next))) break;
        begin = next;
      }
    }
    if (right) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!is_whitespace(decode_utf8(s, next)) || next != end) break;
        end = start;
      }
    }
    return std::string(s.substr(begin, end - begin));
  }
  std::u32string text = to_u32(s);
  std::u32string set = chars ? to_u32(*chars) : std::u32string();
  auto strip_char = [&](char32_t c) { return chars ? in_set(set, c) : is_whitespace(c); };
  size_t begin = 0, end = text.size();
  if (left)
    while (begin < end && strip_char(text[begin])) ++begin;
  if (right)
    while (end > begin && strip_char(text[end - 1])) --end;
  return to_utf8(std::u32string_view(text).substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) runtime_error("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string text = to_u32(s);
  size_t i = 0, n = text.size();
  while (true) {
    while (i < n && is_whitespace(text[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(to_utf8(std::u32string_view(text).substr(i)));
      break;
    }
    size_t j = i;
    while (j < n && !is_whitespace(text[j])) ++j;
    out.push_back(to_utf8(std::u32string_view(text).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) runtime_error("empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::u32string text = to_u32(s);
  size_t j = text.size();
  while (true) {
    while (j > 0 && is_whitespace(text[j - 1])) --j;
    if (j == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(to_utf8(std::u32string_view(text).substr(0, j)));
      break;
    }
    size_t i = j;
    while (i > 0 && !is_whitespace(text[i - 1])) --i;
    out.push_back(to_utf8(std::u32string_view(text).substr(i, j - i)));
    j = i;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::u32string text = to_u32(s);
  std::vector<std::string> out;
  size_t i = 0, n = text.size();
  while (i < n) {
    size_t j = i;
    while (j < n && !is_line_break(text[j])) ++j;
    size_t eol = j;
    if (j < n) {
      eol = (text[j] == '\r' && j + 1 < n && text[j + 1] == '\n') ? j + 2 : j + 1;
    }
    out.push_back(to_utf8(std::u32string_view(text).substr(i, (keepends ? eol : j) - i)));
    i = eol;
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts the replacement before every character and at the end.
    int64_t done = 0;
    size_t pos = 0;
    while (pos <= s.size()) {
      if (count >= 0 && done >= count) {
        out.append(s.substr(pos));
        break;
      }
      out.append(new_text);
      ++done;
      if (pos == s.size()) break;
      size_t next = pos;
      decode_utf8(s, next);
      out.append(s.substr(pos, next - pos));
      pos = next;
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old_text, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(new_text);
    pos = hit + old_text.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) append_upper(out, decode_utf8(s, pos));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) append_lower(out, decode_utf8(s, pos));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t c = decode_utf8(s, pos);
    if (is_cased(c)) {
      if (previous_cased)
        append_lower(out, c);
      else
        append_title(out, c);
      previous_cased = true;
    } else {
      append_utf8(out, c);
      previous_cased = false;
    }
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  bool first = true;
  while (pos < s.size()) {
    char32_t c = decode_utf8(s, pos);
    if (first)
      append_title(out, c);
    else
      append_lower(out, c);
    first = false;
  }
  return out;
}

std::string swapcase(std::string_view s) {
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t c = decode_utf8(s, pos);
    if (is_upper_char(c))
      append_lower(out, c);
    else if (is_lower_char(c))
      append_upper(out, c);
    else
      append_utf8(out, c);
  }
  return out;
}

bool is_upper(std::string_view s) {
  bool any_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t c = decode_utf8(s, pos);
    if (is_lower_char(c) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    if (is_upper_char(c)) any_cased = true;
  }
  return any_cased;
}

bool is_lower(std::string_view s) {
  bool any_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t c = decode_utf8(s, pos);
    if (is_upper_char(c) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    if (is_lower_char(c)) any_cased = true;
  }
  return any_cased;
}

bool is_digit(std::string_view s) { return all_chars(s, is_decimal_char); }
bool is_alpha(std::string_view s) { return all_chars(s, is_alpha_char); }
bool is_alnum(std::string_view s) {
  return all_chars(s, [](char32_t c) { return is_alpha_char(c) || is_numeric_char(c); });
}
bool is_space(std::string_view s) { return all_chars(s, is_whitespace); }
bool is_numeric(std::string_view s) { return all_chars(s, is_numeric_char); }

// ---- indices --------------------------------------------------------------------------

Bounds resolve_bounds(std::optional<int64_t> start, std::optional<int64_t> end, int64_t len) {
  int64_t b = start.value_or(0);
  int64_t e = end.value_or(len);
  if (e > len) {
    e = len;
  } else if (e < 0) {
    e += len;
    if (e < 0) e = 0;
  }
  if (b < 0) {
    b += len;
    if (b < 0) b = 0;
  }
  return {b, e};
}

int64_t find(std::string_view s, std::string_view sub, Bounds b, bool reverse) {
  std::u32string text = to_u32(s);
  std::u32string needle = to_u32(sub);
  int64_t len = static_cast<int64_t>(text.size());
  if (b.start > len || b.end - b.start < static_cast<int64_t>(needle.size())) return -1;
  std::u32string_view window = std::u32string_view(text).substr(b.start, b.end - b.start);
  size_t hit = reverse ? window.rfind(needle) : window.find(needle);
  return hit == std::u32string_view::npos ? -1 : b.start + static_cast<int64_t>(hit);
}

int64_t count(std::string_view s, std::string_view sub, Bounds b) {
  std::u32string text = to_u32(s);
  std::u32string needle = to_u32(sub);
  int64_t len = static_cast<int64_t>(text.size());
  if (b.start > len || b.end < b.start) return 0;
  if (needle.empty()) return b.end - b.start + 1;
  std::u32string_view window = std::u32string_view(text).substr(b.start, b.end - b.start);
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = window.find(needle, pos)) != std::u32string_view::npos) {
    ++n;
    pos += needle.size();
  }
  return n;
}

std::string substr(std::string_view s, int64_t start, int64_t end) {
  if (is_ascii(s)) {
    if (end <= start) return {};
    return std::string(s.substr(start, end - start));
  }
  std::u32string text = to_u32(s);
  if (end <= start) return {};
  return to_utf8(std::u32string_view(text).substr(start, end - start));
}

std::pair<int64_t, int64_t> slice_bounds(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                                         int64_t step) {
  auto adjust = [&](std::optional<int64_t> v, int64_t if_missing) {
    if (!v) return if_missing;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = step < 0 ? len - 1 : len;
    }
    return x;
  };
  return {adjust(start, step < 0 ? len - 1 : 0), adjust(stop, step < 0 ? -1 : len)};
}

std::vector<int64_t> slice_indices(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   int64_t step) {
  auto [b, e] = slice_bounds(len, start, stop, step);
  std::vector<int64_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e;) {
    out.push_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return out;
}

// ---- repr / escape ------------------------------------------------------------------

std::string repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(quote);
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t c = decode_utf8(s, pos);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else if (is_printable(c)) {
      append_utf8(out, c);
    } else if (c <= 0xFF) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c <= 0xFFFF) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
    }
  }
  out.push_back(quote);
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace moeserve::text::jinja::py
