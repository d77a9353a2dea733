// Parser: template source -> syntax tree, following jinja2.parser's grammar and operator
// precedence (filters and tests bind tighter than arithmetic, `**` is left-associative,
// comparisons chain, `a if b` without else is allowed). Syntax errors are TemplateError
// (kSyntax) with the line number.
#pragma once
#include <string>
#include <string_view>

#include "text/jinja/ast.h"

namespace moeserve::text::jinja {

// Nesting deeper than this (parentheses, blocks) is a syntax error rather than a risk
// for the stack; CPython's own limits make real Jinja fail far earlier.
inline constexpr int kMaxParseDepth = 200;

TemplateAst parse_template(std::string_view source, const std::string& template_name);

}  // namespace moeserve::text::jinja
