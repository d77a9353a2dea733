#include "text/jinja/error.h"

#include <fmt/format.h>

namespace moeserve::text::jinja {
namespace {

std::string format_message(TemplateError::Kind kind, const std::string& detail, const std::string& name,
                           int line) {
  const char* what = "template error";
  switch (kind) {
    case TemplateError::Kind::kSyntax: what = "template syntax error"; break;
    case TemplateError::Kind::kRuntime: what = "template error"; break;
    case TemplateError::Kind::kRaised: what = "template raised an exception"; break;
    case TemplateError::Kind::kLimit: what = "template limit exceeded"; break;
  }
  std::string where = name.empty() ? std::string("template") : fmt::format("'{}'", name);
  if (line > 0) return fmt::format("{} in {}, line {}: {}", what, where, line, detail);
  return fmt::format("{} in {}: {}", what, where, detail);
}

}  // namespace

TemplateError::TemplateError(Kind kind, std::string detail, std::string template_name, int line)
    : moeserve::Error(format_message(kind, detail, template_name, line)),
      kind_(kind),
      detail_(std::move(detail)),
      template_name_(std::move(template_name)),
      line_(line) {}

TemplateError TemplateError::located(const std::string& template_name, int line) const {
  return TemplateError(kind_, detail_, template_name, line);
}

void runtime_error(std::string message) { throw TemplateError(TemplateError::Kind::kRuntime, std::move(message)); }

void limit_error(std::string message) { throw TemplateError(TemplateError::Kind::kLimit, std::move(message)); }

}  // namespace moeserve::text::jinja
