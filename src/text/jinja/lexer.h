// Tokenizer for Jinja2 template source, reproducing jinja2.lexer with the settings
// transformers uses: default delimiters, trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False, no line statements. Whitespace control works as in
// Jinja: "{%-"/"{{-"/"{#-" strip all whitespace before the tag, "-%}"/"-}}"/"-#}" all
// whitespace after it, "{%+" disables lstrip_blocks and "+%}" trim_blocks for one tag.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::text::jinja {

enum class TokenType : uint8_t {
  kData,           // literal template text
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEof,
};

enum class Op : uint8_t {
  kAdd, kSub, kDiv, kFloorDiv, kMul, kMod, kPow, kTilde,
  kLBracket, kRBracket, kLParen, kRParen, kLBrace, kRBrace,
  kEq, kNe, kGt, kGe, kLt, kLe, kAssign, kDot, kColon, kPipe, kComma, kSemicolon,
};

struct Token {
  TokenType type = TokenType::kEof;
  Op op = Op::kAdd;         // kOperator
  std::string text;         // kData, kName, kString (unescaped)
  int64_t int_value = 0;    // kInteger
  double float_value = 0;   // kFloat
  int line = 1;
};

// Tokenizes the whole template; throws TemplateError (kSyntax) naming `template_name`.
std::vector<Token> tokenize(std::string_view source, const std::string& template_name);

std::string_view op_text(Op op);
// For error messages: "end of print statement", "'%}'", "name 'x'", ...
std::string describe_token(const Token& token);

}  // namespace moeserve::text::jinja
