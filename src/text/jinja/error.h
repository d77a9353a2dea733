// Template errors. Everything that can go wrong while parsing or rendering a template
// (a syntax error, an undefined function, a type error, raise_exception(), a limit) is a
// TemplateError: a moeserve::Error whose message names the template and the line.
//
// Inside the interpreter, code that has no line number at hand throws with line 0; the
// innermost expression or statement being evaluated fills it in (Interpreter::eval).
#pragma once
#include <string>

#include "core/error.h"

namespace moeserve::text::jinja {

class TemplateError : public moeserve::Error {
 public:
  enum class Kind {
    kSyntax,   // the template does not parse
    kRuntime,  // a Python-level error while rendering (TypeError, UndefinedError, ...)
    kRaised,   // the template called raise_exception(message)
    kLimit,    // a render limit (recursion, loop iterations, output size) was hit
  };

  TemplateError(Kind kind, std::string detail, std::string template_name = {}, int line = 0);

  Kind kind() const { return kind_; }
  // The message without the template name and line.
  const std::string& detail() const { return detail_; }
  const std::string& template_name() const { return template_name_; }
  int line() const { return line_; }
  // The same error, located at `line` of `template_name`.
  TemplateError located(const std::string& template_name, int line) const;

 private:
  Kind kind_;
  std::string detail_;
  std::string template_name_;
  int line_;
};

// Shorthands for the interpreter's Python-style runtime errors (line filled in later).
[[noreturn]] void runtime_error(std::string message);
[[noreturn]] void limit_error(std::string message);

}  // namespace moeserve::text::jinja
