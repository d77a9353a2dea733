#include "text/jinja/lexer.h"

#include <cmath>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/py_number.h"
#include "text/jinja/py_string.h"

namespace moeserve::text::jinja {
namespace {

// Jinja splits the source on \r\n, \r and \n, joins with \n, and (keep_trailing_newline
// being off) drops one trailing newline.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    char c = source[i];
    if (c == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  Lexer(std::string source, const std::string& name) : src_(std::move(source)), name_(name) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag_start(pos_);
      if (tag == std::string::npos) {
        emit_data(src_.substr(pos_));
        line_ += count_newlines(pos_, src_.size());
        pos_ = src_.size();
        break;
      }
      lex_tag(tag);
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = line_;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& message, int line) const {
    throw TemplateError(TemplateError::Kind::kSyntax, message, name_, line);
  }

  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  int count_newlines(size_t from, size_t to) const {
    int n = 0;
    for (size_t i = from; i < to; ++i) n += src_[i] == '\n';
    return n;
  }

  // Python's \s at `i` (ASCII fast path; Unicode spaces decoded). Returns its byte length or 0.
  size_t whitespace_at(size_t i) const {
    unsigned char c = static_cast<unsigned char>(src_[i]);
    if (c < 0x80) return py::is_whitespace(c) ? 1 : 0;
    size_t p = i;
    char32_t cp = py::decode_utf8(src_, p);
    return py::is_whitespace(cp) ? p - i : 0;
  }
  size_t skip_whitespace(size_t i) const {
    while (i < src_.size()) {
      size_t n = whitespace_at(i);
      if (!n) break;
      i += n;
    }
    return i;
  }
  bool starts_with(size_t i, std::string_view s) const { return src_.compare(i, s.size(), s) == 0; }

  void emit_data(std::string text) {
    if (text.empty()) return;
    Token t;
    t.type = TokenType::kData;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  // The text before a tag, with "-" stripping or lstrip_blocks applied.
  std::string strip_before_tag(std::string text, char sign, bool is_variable) const {
    if (sign == '-') return py::strip(text, std::nullopt, false, true);
    if (sign == '+' || is_variable) return text;
    size_t nl = text.rfind('\n');
    size_t line_start = nl == std::string::npos ? 0 : nl + 1;
    if (line_start == 0 && !line_starting_) return text;
    std::string_view tail = std::string_view(text).substr(line_start);
    if (tail.empty()) return text;
    for (size_t p = 0; p < tail.size();) {
      char32_t c = py::decode_utf8(tail, p);
      if (!py::is_whitespace(c)) return text;
    }
    text.resize(line_start);
    return text;
  }

  // "{%[-+]? raw [-]?%}" at `i`: returns the end of the match.
  std::optional<size_t> match_raw_begin(size_t i) const {
    size_t p = i + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_whitespace(p);
    if (!starts_with(p, "raw")) return std::nullopt;
    p += 3;
    if (p < src_.size() && is_name_char(src_[p])) return std::nullopt;  // e.g. "rawfoo"
    p = skip_whitespace(p);
    if (starts_with(p, "-%}")) return skip_whitespace(p + 3);
    if (starts_with(p, "%}")) return p + 2;
    return std::nullopt;
  }

  void lex_tag(size_t tag) {
    char kind = src_[tag + 1];
    bool is_variable = kind == '{';
    std::optional<size_t> raw_end = kind == '%' ? match_raw_begin(tag) : std::nullopt;
    size_t after_start = tag + 2;
    char sign = 0;
    if (after_start < src_.size() && (src_[after_start] == '-' || src_[after_start] == '+')) {
      sign = src_[after_start];
      ++after_start;
    }
    std::string text = strip_before_tag(src_.substr(pos_, tag - pos_), sign, is_variable);
    emit_data(std::move(text));
    line_ += count_newlines(pos_, tag);
    line_starting_ = false;
    if (raw_end) {
      lex_raw(tag, *raw_end);
    } else if (kind == '#') {
      lex_comment(tag, after_start);
    } else {
      lex_expression_tag(tag, after_start, is_variable);
    }
  }

  void lex_raw(size_t tag, size_t content_start) {
    int start_line = line_;
    line_ += count_newlines(tag, content_start);
    line_starting_ = content_start > 0 && src_[content_start - 1] == '\n';
    // Find "{%[-+]? endraw ... %}".
    for (size_t i = src_.find("{%", content_start); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = skip_whitespace(p);
      if (!starts_with(p, "endraw")) continue;
      p = skip_whitespace(p + 6);
      size_t end;
      if (starts_with(p, "+%}")) {
        end = p + 3;
      } else if (starts_with(p, "-%}")) {
        end = skip_whitespace(p + 3);
      } else if (starts_with(p, "%}")) {
        end = p + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      std::string text = strip_before_tag(src_.substr(content_start, i - content_start), sign, false);
      emit_data(std::move(text));
      line_ += count_newlines(content_start, end);
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    fail("Missing end of raw directive", start_line);
  }

  void lex_comment(size_t tag, size_t body_start) {
    for (size_t i = body_start; i < src_.size(); ++i) {
      size_t end;
      if (starts_with(i, "+#}")) {
        end = i + 3;
      } else if (starts_with(i, "-#}")) {
        end = skip_whitespace(i + 3);
      } else if (starts_with(i, "#}")) {
        end = i + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      line_ += count_newlines(tag, end);
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    fail("Missing end of comment tag", line_);
  }

  void push(TokenType type, int line) {
    Token t;
    t.type = type;
    t.line = line;
    tokens_.push_back(std::move(t));
  }

  void lex_expression_tag(size_t tag, size_t body_start, bool is_variable) {
    push(is_variable ? TokenType::kVariableBegin : TokenType::kBlockBegin, line_);
    line_ += count_newlines(tag, body_start);
    size_t p = body_start;
    std::vector<char> balance;
    while (true) {
      p = skip_whitespace_counting(p);
      if (p >= src_.size()) {
        pos_ = p;  // the parser reports the missing end tag
        return;
      }
      if (balance.empty()) {
        std::optional<size_t> end = match_tag_end(p, is_variable);
        if (end) {
          push(is_variable ? TokenType::kVariableEnd : TokenType::kBlockEnd, line_);
          line_ += count_newlines(p, *end);
          line_starting_ = src_[*end - 1] == '\n';
          pos_ = *end;
          return;
        }
      }
      p = lex_one(p, balance);
    }
  }

  size_t skip_whitespace_counting(size_t p) {
    size_t q = skip_whitespace(p);
    line_ += count_newlines(p, q);
    return q;
  }

  std::optional<size_t> match_tag_end(size_t p, bool is_variable) const {
    if (is_variable) {
      if (starts_with(p, "-}}")) return skip_whitespace(p + 3);
      if (starts_with(p, "}}")) return p + 2;
      return std::nullopt;
    }
    if (starts_with(p, "+%}")) return p + 3;
    if (starts_with(p, "-%}")) return skip_whitespace(p + 3);
    if (starts_with(p, "%}")) {
      size_t end = p + 2;
      if (end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
      return end;
    }
    return std::nullopt;
  }

  // Lexes one token inside a tag; returns the position after it.
  size_t lex_one(size_t p, std::vector<char>& balance) {
    char c = src_[p];
    if (is_digit(c)) {
      if (size_t end = match_float(p); end != p) return emit_float(p, end);
      return emit_integer(p);
    }
    if (is_name_start(c)) {
      size_t end = p;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      Token t;
      t.type = TokenType::kName;
      t.text = src_.substr(p, end - p);
      t.line = line_;
      tokens_.push_back(std::move(t));
      return end;
    }
    if (c == '\'' || c == '"') return lex_string(p);
    return lex_operator(p, balance);
  }

  // Jinja's float_re: digits with '_' separators, then a fraction and/or an exponent; not
  // right after a '.' (so "x.0.1" is an attribute chain).
  size_t match_float(size_t p) const {
    if (p > 0 && src_[p - 1] == '.') return p;
    auto digits = [&](size_t q) {  // (\d+_)*\d+
      size_t start = q;
      while (q < src_.size() && is_digit(src_[q])) {
        ++q;
        if (q + 1 < src_.size() && src_[q] == '_' && is_digit(src_[q + 1])) ++q;
      }
      return q == start ? std::string::npos : q;
    };
    size_t q = digits(p);
    if (q == std::string::npos) return p;
    size_t frac_end = std::string::npos;
    if (q < src_.size() && src_[q] == '.') frac_end = digits(q + 1);
    size_t after_mantissa = frac_end != std::string::npos ? frac_end : q;
    if (after_mantissa < src_.size() && (src_[after_mantissa] == 'e' || src_[after_mantissa] == 'E')) {
      size_t e = after_mantissa + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      size_t exp_end = digits(e);
      if (exp_end != std::string::npos) return exp_end;
    }
    return frac_end != std::string::npos ? frac_end : p;
  }

  size_t emit_float(size_t p, size_t end) {
    std::string text;
    for (size_t i = p; i < end; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    Token t;
    t.type = TokenType::kFloat;
    t.float_value = std::strtod(text.c_str(), nullptr);
    t.line = line_;
    tokens_.push_back(std::move(t));
    return end;
  }

  size_t emit_integer(size_t p) {
    auto lower = [&](size_t i) { return static_cast<char>(std::tolower(static_cast<unsigned char>(src_[i]))); };
    int base = 10;
    size_t digits_start = p;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      char prefix = lower(p + 1);
      if (prefix == 'b') base = 2;
      if (prefix == 'o') base = 8;
      if (prefix == 'x') base = 16;
      if (base != 10) digits_start = p + 2;
    }
    auto is_base_digit = [&](size_t i) {
      if (i >= src_.size()) return false;
      char ch = lower(i);
      int v = is_digit(ch) ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10 : 99;
      return v < base;
    };
    size_t end = digits_start;
    if (base != 10) {
      // (_?digit)+ ; without a digit the "0" alone is the integer.
      while (true) {
        size_t q = end;
        if (q < src_.size() && src_[q] == '_') ++q;
        if (!is_base_digit(q)) break;
        end = q + 1;
      }
      if (end == digits_start) {
        base = 10;
        end = p + 1;
        digits_start = p;
      }
    } else if (src_[p] == '0') {
      end = p + 1;  // 0(_?0)*
      while (true) {
        size_t q = end;
        if (q < src_.size() && src_[q] == '_') ++q;
        if (q >= src_.size() || src_[q] != '0') break;
        end = q + 1;
      }
    } else {
      end = p + 1;  // [1-9](_?\d)*
      while (true) {
        size_t q = end;
        if (q < src_.size() && src_[q] == '_') ++q;
        if (q >= src_.size() || !is_digit(src_[q])) break;
        end = q + 1;
      }
    }
    std::string digits;
    for (size_t i = digits_start; i < end; ++i)
      if (src_[i] != '_') digits.push_back(src_[i]);
    std::optional<int64_t> value = py::parse_int(digits, base);
    if (!value) fail("integer literal " + src_.substr(p, end - p) + " is too large", line_);
    Token t;
    t.type = TokenType::kInteger;
    t.int_value = *value;
    t.line = line_;
    tokens_.push_back(std::move(t));
    return end;
  }

  size_t lex_string(size_t p) {
    char quote = src_[p];
    size_t i = p + 1;
    while (i < src_.size() && src_[i] != quote) {
      if (src_[i] == '\\') ++i;
      ++i;
    }
    if (i >= src_.size()) fail(fmt::format("unexpected char {} at {}", py::repr(std::string(1, quote)), p), line_);
    Token t;
    t.type = TokenType::kString;
    t.text = unescape(std::string_view(src_).substr(p + 1, i - p - 1));
    t.line = line_;
    tokens_.push_back(std::move(t));
    line_ += count_newlines(p, i);
    return i + 1;
  }

  // Python's "unicode-escape" decoding of a string literal body.
  std::string unescape(std::string_view body) const {
    std::string out;
    out.reserve(body.size());
    auto hex_value = [](char ch) -> int {
      if (ch >= '0' && ch <= '9') return ch - '0';
      if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
      if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
      return -1;
    };
    for (size_t i = 0; i < body.size(); ++i) {
      char c = body[i];
      if (c != '\\' || i + 1 >= body.size()) {
        out.push_back(c);
        continue;
      }
      char e = body[++i];
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            int v = i + 1 + k < body.size() ? hex_value(body[i + 1 + k]) : -1;
            if (v < 0) fail(fmt::format("truncated \\{}{} escape", e, std::string(n, 'X')), line_);
            cp = cp * 16 + static_cast<uint32_t>(v);
          }
          if (cp > 0x10FFFF) fail("illegal Unicode character", line_);
          i += n;
          py::append_utf8(out, (cp >= 0xD800 && cp <= 0xDFFF) ? 0xFFFD : cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
              cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
            py::append_utf8(out, cp);
          } else {
            out.push_back('\\');  // unknown escapes are kept verbatim
            out.push_back(e);
          }
      }
    }
    return out;
  }

  size_t lex_operator(size_t p, std::vector<char>& balance) {
    static const std::pair<std::string_view, Op> kOps[] = {
        {"//", Op::kFloorDiv}, {"**", Op::kPow}, {"==", Op::kEq},     {"!=", Op::kNe},      {">=", Op::kGe},
        {"<=", Op::kLe},       {"+", Op::kAdd},  {"-", Op::kSub},     {"/", Op::kDiv},      {"*", Op::kMul},
        {"%", Op::kMod},       {"~", Op::kTilde}, {"[", Op::kLBracket}, {"]", Op::kRBracket}, {"(", Op::kLParen},
        {")", Op::kRParen},    {"{", Op::kLBrace}, {"}", Op::kRBrace},  {">", Op::kGt},       {"<", Op::kLt},
        {"=", Op::kAssign},    {".", Op::kDot},  {":", Op::kColon},   {"|", Op::kPipe},     {",", Op::kComma},
        {";", Op::kSemicolon},
    };
    for (const auto& [text, op] : kOps) {
      if (!starts_with(p, text)) continue;
      if (op == Op::kLBrace || op == Op::kLParen || op == Op::kLBracket) {
        balance.push_back(op == Op::kLBrace ? '}' : op == Op::kLParen ? ')' : ']');
      } else if (op == Op::kRBrace || op == Op::kRParen || op == Op::kRBracket) {
        if (balance.empty()) fail(fmt::format("unexpected '{}'", text), line_);
        char expected = balance.back();
        balance.pop_back();
        if (expected != text[0]) fail(fmt::format("unexpected '{}', expected '{}'", text, expected), line_);
      }
      Token t;
      t.type = TokenType::kOperator;
      t.op = op;
      t.line = line_;
      tokens_.push_back(std::move(t));
      return p + text.size();
    }
    size_t q = p;
    char32_t cp = py::decode_utf8(src_, q);
    std::string ch;
    py::append_utf8(ch, cp);
    fail(fmt::format("unexpected char {} at {}", py::repr(ch), p), line_);
  }

  std::string src_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& template_name) {
  return Lexer(normalize_newlines(source), template_name).run();
}

std::string_view op_text(Op op) {
  switch (op) {
    case Op::kAdd: return "+";
    case Op::kSub: return "-";
    case Op::kDiv: return "/";
    case Op::kFloorDiv: return "//";
    case Op::kMul: return "*";
    case Op::kMod: return "%";
    case Op::kPow: return "**";
    case Op::kTilde: return "~";
    case Op::kLBracket: return "[";
    case Op::kRBracket: return "]";
    case Op::kLParen: return "(";
    case Op::kRParen: return ")";
    case Op::kLBrace: return "{";
    case Op::kRBrace: return "}";
    case Op::kEq: return "==";
    case Op::kNe: return "!=";
    case Op::kGt: return ">";
    case Op::kGe: return ">=";
    case Op::kLt: return "<";
    case Op::kLe: return "<=";
    case Op::kAssign: return "=";
    case Op::kDot: return ".";
    case Op::kColon: return ":";
    case Op::kPipe: return "|";
    case Op::kComma: return ",";
    case Op::kSemicolon: return ";";
  }
  return "?";
}

std::string describe_token(const Token& token) {
  switch (token.type) {
    case TokenType::kData: return "template data / text";
    case TokenType::kVariableBegin: return "begin of print statement";
    case TokenType::kVariableEnd: return "end of print statement";
    case TokenType::kBlockBegin: return "begin of statement block";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kName: return token.text;
    case TokenType::kString: return "string";
    case TokenType::kInteger: return "integer";
    case TokenType::kFloat: return "float";
    case TokenType::kOperator: return std::string(op_text(token.op));
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

}  // namespace moeserve::text::jinja
