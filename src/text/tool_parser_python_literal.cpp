#include "text/tool_parser_python_literal.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "text/unicode.h"

namespace moeserve::text {
namespace {

using Json = nlohmann::ordered_json;
constexpr int kMaxDepth = 64;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Recursive-descent reader over the bytes of one literal. Every method returns false
// (or nullopt) on anything that is not a literal; nothing throws.
class Reader {
 public:
  explicit Reader(std::string_view text) : s_(text) {}

  std::optional<Json> read_all() {
    skip_space();
    std::optional<Json> v = value(0);
    if (!v) return std::nullopt;
    skip_space();
    if (pos_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  bool at_end() const { return pos_ >= s_.size(); }
  char peek(std::size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }

  // Whitespace and line continuations between tokens (inside brackets Python allows newlines).
  void skip_space() {
    while (!at_end()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f') {
        ++pos_;
      } else if (c == '\\' && (peek(1) == '\n' || peek(1) == '\r')) {
        pos_ += 2;
      } else {
        break;
      }
    }
  }

  std::optional<Json> value(int depth) {
    if (depth > kMaxDepth || at_end()) return std::nullopt;
    const char c = peek();
    if (c == '{') return dict(depth);
    if (c == '[') return sequence(depth, ']');
    if (c == '(') return tuple(depth);
    if (c == '\'' || c == '"') return strings();
    if (is_digit(c) || c == '.' || c == '+' || c == '-') return number();
    if (is_ident_char(c)) {
      // A string prefix (r, u, R, U) directly followed by a quote, or a keyword.
      if ((c == 'r' || c == 'R' || c == 'u' || c == 'U') && (peek(1) == '\'' || peek(1) == '"')) return strings();
      std::size_t end = pos_;
      while (end < s_.size() && is_ident_char(s_[end])) ++end;
      const std::string_view word = s_.substr(pos_, end - pos_);
      pos_ = end;
      if (word == "True" || word == "true") return Json(true);
      if (word == "False" || word == "false") return Json(false);
      if (word == "None" || word == "null") return Json(nullptr);
      return std::nullopt;
    }
    return std::nullopt;
  }

  // Elements separated by commas up to `close`, a trailing comma allowed. `saw_comma`
  // tells a one-element tuple "(x,)" from a parenthesised value "(x)".
  bool elements(int depth, char close, Json& out, bool& saw_comma) {
    saw_comma = false;
    for (;;) {
      skip_space();
      if (peek() == close) {
        ++pos_;
        return true;
      }
      std::optional<Json> item = value(depth + 1);
      if (!item) return false;
      out.push_back(std::move(*item));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        saw_comma = true;
      } else if (peek() != close) {
        return false;
      }
    }
  }

  std::optional<Json> sequence(int depth, char close) {
    ++pos_;  // [
    Json out = Json::array();
    bool saw_comma = false;
    if (!elements(depth, close, out, saw_comma)) return std::nullopt;
    return out;
  }

  std::optional<Json> tuple(int depth) {
    ++pos_;  // (
    Json out = Json::array();
    bool saw_comma = false;
    if (!elements(depth, ')', out, saw_comma)) return std::nullopt;
    if (out.size() == 1 && !saw_comma) return std::move(out[0]);  // "(x)" is just x
    return out;
  }

  // JSON object keys are strings: Python's json.dumps writes int, bool and None keys as
  // their JSON text; container keys cannot be written.
  static std::optional<std::string> key_text(const Json& key) {
    if (key.is_string()) return key.get<std::string>();
    if (key.is_number() || key.is_boolean() || key.is_null()) return key.dump();
    return std::nullopt;
  }

  std::optional<Json> dict(int depth) {
    ++pos_;  // {
    Json out = Json::object();
    for (;;) {
      skip_space();
      if (peek() == '}') {
        ++pos_;
        return out;
      }
      std::optional<Json> key = value(depth + 1);
      if (!key) return std::nullopt;
      skip_space();
      if (peek() != ':') return std::nullopt;  // a set, or not a literal
      ++pos_;
      skip_space();
      std::optional<Json> val = value(depth + 1);
      if (!val) return std::nullopt;
      std::optional<std::string> name = key_text(*key);
      if (!name) return std::nullopt;
      out[*name] = std::move(*val);  // a repeated key keeps its first position, last value
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        return std::nullopt;
      }
    }
  }

  // One or more adjacent string literals, concatenated as Python does.
  std::optional<Json> strings() {
    std::string out;
    bool any = false;
    for (;;) {
      skip_space();
      bool raw = false;
      const std::size_t save = pos_;
      while (!at_end() && (peek() == 'r' || peek() == 'R' || peek() == 'u' || peek() == 'U')) {
        raw = raw || peek() == 'r' || peek() == 'R';
        ++pos_;
      }
      if (peek() != '\'' && peek() != '"') {
        pos_ = save;
        break;
      }
      if (pos_ - save > 2) return std::nullopt;
      if (!string_body(raw, out)) return std::nullopt;
      any = true;
    }
    if (!any) return std::nullopt;
    return Json(std::move(out));
  }

  bool string_body(bool raw, std::string& out) {
    const char quote = peek();
    const bool triple = peek(1) == quote && peek(2) == quote;
    pos_ += triple ? 3 : 1;
    for (;;) {
      if (at_end()) return false;
      const char c = s_[pos_];
      if (c == quote) {
        if (!triple) {
          ++pos_;
          return true;
        }
        if (peek(1) == quote && peek(2) == quote) {
          pos_ += 3;
          return true;
        }
        out += c;
        ++pos_;
        continue;
      }
      if ((c == '\n' || c == '\r') && !triple) return false;
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= s_.size()) return false;
      if (raw) {  // a backslash keeps the next byte (so \' does not end the string)
        out += c;
        out += s_[pos_ + 1];
        pos_ += 2;
        continue;
      }
      if (!escape(out)) return false;
    }
  }

  // One escape sequence at pos_ (which is at the backslash).
  bool escape(std::string& out) {
    const char e = s_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case '\n': return true;  // line continuation
      case '\r':
        if (peek() == '\n') ++pos_;
        return true;
      case '\\': out += '\\'; return true;
      case '\'': out += '\''; return true;
      case '"': out += '"'; return true;
      case 'a': out += '\a'; return true;
      case 'b': out += '\b'; return true;
      case 'f': out += '\f'; return true;
      case 'n': out += '\n'; return true;
      case 'r': out += '\r'; return true;
      case 't': out += '\t'; return true;
      case 'v': out += '\v'; return true;
      case 'x': return hex_escape(2, out);
      case 'u': return hex_escape(4, out);
      case 'U': return hex_escape(8, out);
      case 'N': return false;  // \N{NAME}: needs the Unicode name table
      default: break;
    }
    if (e >= '0' && e <= '7') {
      std::uint32_t cp = static_cast<std::uint32_t>(e - '0');
      for (int i = 0; i < 2 && peek() >= '0' && peek() <= '7'; ++i) cp = cp * 8 + static_cast<std::uint32_t>(s_[pos_++] - '0');
      append_utf8(out, cp);
      return true;
    }
    out += '\\';  // an unknown escape keeps its backslash, as in Python
    out += e;
    return true;
  }

  bool hex_escape(int digits, std::string& out) {
    std::uint32_t cp = 0;
    for (int i = 0; i < digits; ++i) {
      const int h = hex_value(peek());
      if (h < 0) return false;
      cp = cp * 16 + static_cast<std::uint32_t>(h);
      ++pos_;
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    append_utf8(out, cp);
    return true;
  }

  std::optional<Json> number() {
    bool negative = false;
    if (peek() == '+' || peek() == '-') {
      negative = peek() == '-';
      ++pos_;
      skip_space();
    }
    const std::size_t start = pos_;
    // Prefixed integers: 0x.., 0o.., 0b..
    if (peek() == '0' && (peek(1) == 'x' || peek(1) == 'X' || peek(1) == 'o' || peek(1) == 'O' || peek(1) == 'b' ||
                          peek(1) == 'B')) {
      const char p = static_cast<char>(peek(1) | 0x20);
      const int base = p == 'x' ? 16 : (p == 'o' ? 8 : 2);
      pos_ += 2;
      std::string digits;
      while (!at_end() && (is_ident_char(peek()))) {
        if (peek() != '_') digits += peek();
        ++pos_;
      }
      if (digits.empty()) return std::nullopt;
      for (char d : digits) {
        const int v = hex_value(d);
        if (v < 0 || v >= base) return std::nullopt;
      }
      return integer(digits, base, negative);
    }
    std::string text;
    bool is_float = false;
    // Digits with single underscores between them ("1_000"); false when there are none
    // or an underscore is misplaced.
    bool bad_underscore = false;
    auto read_digits = [&] {
      bool any = false;
      while (!at_end() && (is_digit(peek()) || peek() == '_')) {
        if (peek() == '_') {
          if (!any || !is_digit(peek(1))) bad_underscore = true;
        } else {
          text += peek();
          any = true;
        }
        ++pos_;
      }
      return any;
    };
    const bool int_part = read_digits();
    bool frac_part = false;
    if (peek() == '.') {
      is_float = true;
      text += '.';
      ++pos_;
      frac_part = read_digits();
    }
    if (!int_part && !frac_part) return std::nullopt;
    if (peek() == 'e' || peek() == 'E') {
      is_float = true;
      text += 'e';
      ++pos_;
      if (peek() == '+' || peek() == '-') text += s_[pos_++];
      if (!read_digits()) return std::nullopt;
    }
    if (bad_underscore) return std::nullopt;
    if (!at_end() && (is_ident_char(peek()) || peek() == '.')) return std::nullopt;  // 1j, 1.2.3, 12abc
    if (pos_ == start) return std::nullopt;
    if (!is_float) {
      // Python rejects leading zeros in a decimal integer ("01"), except for zero itself.
      if (text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos) return std::nullopt;
      return integer(text, 10, negative);
    }
    errno = 0;
    const double v = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(v)) return std::nullopt;
    return Json(negative ? -v : v);
  }

  static std::optional<Json> integer(const std::string& digits, int base, bool negative) {
    errno = 0;
    char* end = nullptr;
    const unsigned long long magnitude = std::strtoull(digits.c_str(), &end, base);
    if (errno == ERANGE) {
      // Beyond 64 bits: JSON has no big integers here; keep the value as a float.
      double v = 0;
      for (char d : digits) v = v * base + hex_value(d);
      if (!std::isfinite(v)) return std::nullopt;
      return Json(negative ? -v : v);
    }
    if (!negative) {
      if (magnitude <= static_cast<unsigned long long>(std::numeric_limits<std::int64_t>::max())) {
        return Json(static_cast<std::int64_t>(magnitude));
      }
      return Json(static_cast<std::uint64_t>(magnitude));
    }
    constexpr unsigned long long kMinMagnitude = 1ULL << 63;
    if (magnitude < kMinMagnitude) return Json(-static_cast<std::int64_t>(magnitude));
    if (magnitude == kMinMagnitude) return Json(std::numeric_limits<std::int64_t>::min());
    return Json(-static_cast<double>(magnitude));
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

std::optional<nlohmann::ordered_json> parse_python_literal(std::string_view text) { return Reader(text).read_all(); }

}  // namespace moeserve::text
