#include "text/jinja/template.h"

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/parser.h"
#include "text/jinja/py_string.h"

namespace moeserve::text::jinja {

Template Template::parse(std::string_view source, std::string name) {
  if (!py::is_valid_utf8(source))
    throw TemplateError(TemplateError::Kind::kSyntax, "the template is not valid UTF-8", name);
  auto ast = std::make_shared<TemplateAst>(parse_template(source, name));
  return Template(std::move(name), std::move(ast));
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& variables,
                             const RenderLimits& limits) const {
  auto globals = std::make_shared<Scope>();
  install_builtins(*globals);
  for (const auto& [key, value] : variables) globals->set(key, value);
  Interpreter interpreter(*ast_, name_, limits);
  return interpreter.render(globals);
}

}  // namespace moeserve::text::jinja
