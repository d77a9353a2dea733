// A compiled Jinja2 template: parse once, render many times (concurrently: rendering
// only reads the syntax tree). This is the engine behind ChatTemplate; see
// src/text/chat_template.h for the chat-specific API.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/value.h"

namespace moeserve::text::jinja {

class Template {
 public:
  // Parses `source`. Throws TemplateError (kSyntax) naming `name` and the line.
  static Template parse(std::string_view source, std::string name = "template");

  // Renders with `variables` (name, value) on top of the builtin globals. Throws
  // TemplateError on any runtime error, raise_exception() or limit.
  std::string render(const std::vector<std::pair<std::string, Value>>& variables,
                     const RenderLimits& limits = {}) const;

  const std::string& name() const { return name_; }

 private:
  Template(std::string name, std::shared_ptr<const TemplateAst> ast) : name_(std::move(name)), ast_(std::move(ast)) {}
  std::string name_;
  std::shared_ptr<const TemplateAst> ast_;
};

}  // namespace moeserve::text::jinja
