// Template errors: every failure is a TemplateError (a moeserve::Error) with the right
// kind and line, never a crash; runaway templates stop at the render limits.
#include <gtest/gtest.h>

#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "text/jinja/error.h"
#include "text/jinja/json_convert.h"
#include "text/jinja/template.h"

namespace moeserve::text::jinja {
namespace {

using Kind = TemplateError::Kind;

TemplateError render_error(const std::string& source, const RenderLimits& limits = {},
                           const std::vector<std::pair<std::string, Value>>& vars = {}) {
  try {
    Template::parse(source, "t.jinja").render(vars, limits);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for: " << source;
  return TemplateError(Kind::kRuntime, "none");
}

void expect_error(const std::string& source, Kind kind, int line, const std::string& fragment,
                  const RenderLimits& limits = {}) {
  SCOPED_TRACE(source);
  TemplateError e = render_error(source, limits);
  EXPECT_EQ(e.kind(), kind) << e.what();
  EXPECT_EQ(e.line(), line) << e.what();
  EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("t.jinja"), std::string::npos) << e.what();
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  expect_error("line1\n{% if x %}\nline3\n{% endfor %}", Kind::kSyntax, 4, "Encountered unknown tag 'endfor'");
  expect_error("{% for x in y %}\n\nbody", Kind::kSyntax, 3, "Unexpected end of template");
  expect_error("a\nb\n{{ 1 + }}", Kind::kSyntax, 3, "unexpected");
  expect_error("{{ x|nosuchfilter }}", Kind::kSyntax, 1, "No filter named 'nosuchfilter'");
  expect_error("\n{{ x is nosuchtest }}", Kind::kSyntax, 2, "No test named 'nosuchtest'");
  expect_error("{% break %}", Kind::kSyntax, 1, "'break' outside loop");
  expect_error("{% macro m() %}{% continue %}{% endmacro %}", Kind::kSyntax, 1, "'continue' outside loop");
  expect_error("{% autoescape true %}{% endautoescape %}", Kind::kSyntax, 1, "not supported");
  expect_error("x\n{# never closed", Kind::kSyntax, 2, "Missing end of comment tag");
  expect_error("{{ 'abc }}", Kind::kSyntax, 1, "unexpected char");
  expect_error("{{ (1] }}", Kind::kSyntax, 1, "unexpected ']'");
  expect_error("{{ 99999999999999999999 }}", Kind::kSyntax, 1, "too large");
  expect_error("{{ '\\x4' }}", Kind::kSyntax, 1, "escape");
}

TEST(JinjaErrors, DeepNestingIsASyntaxErrorNotAStackOverflow) {
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  expect_error(deep, Kind::kSyntax, 1, "nests deeper");
  std::string blocks;
  for (int i = 0; i < 500; ++i) blocks += "{% if true %}";
  expect_error(blocks, Kind::kSyntax, 1, "nests deeper");
  std::string lists = "{{ " + std::string(3000, '[') + std::string(3000, ']') + " }}";
  expect_error(lists, Kind::kSyntax, 1, "nests deeper");
  // Left-deep chains nest the tree without recursing in the parser.
  std::string sum = "{{ 1";
  for (int i = 0; i < 100000; ++i) sum += " + 1";
  expect_error(sum + " }}", Kind::kSyntax, 1, "nests deeper");
  std::string attrs = "{{ x";
  for (int i = 0; i < 100000; ++i) attrs += ".a";
  expect_error(attrs + " }}", Kind::kSyntax, 1, "nests deeper");
  std::string filters = "{{ x";
  for (int i = 0; i < 100000; ++i) filters += "|trim";
  expect_error(filters + " }}", Kind::kSyntax, 1, "nests deeper");
  std::string ors = "{{ x";
  for (int i = 0; i < 100000; ++i) ors += " or x";
  expect_error(ors + " }}", Kind::kSyntax, 1, "nests deeper");
  // Moderate depth still renders.
  std::string fine = "{{ " + std::string(60, '(') + "1" + std::string(60, ')');
  for (int i = 0; i < 60; ++i) fine += " + 1";
  EXPECT_EQ(Template::parse(fine + " }}", "t").render({}), "61");
}

TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
  expect_error("ok\n\n{{ undefined_function() }}", Kind::kRuntime, 3, "'undefined_function' is undefined");
  expect_error("{% set m = {} %}\n{{ m.a.b }}", Kind::kRuntime, 2, "has no attribute 'a'");
  expect_error("{{ 1 + 'a' }}", Kind::kRuntime, 1, "unsupported operand type(s) for +");
  expect_error("{% for x in 5 %}{% endfor %}", Kind::kRuntime, 1, "'int' object is not iterable");
  expect_error("{% macro m() %}\n{{ 1 // 0 }}\n{% endmacro %}\n{{ m() }}", Kind::kRuntime, 2, "division or modulo by zero");
  expect_error("{{ [1, 2].append(3) }}", Kind::kRuntime, 1, "access to attribute 'append' of 'list' object is unsafe");
  expect_error("{% include 'other.jinja' %}", Kind::kRuntime, 1, "template loader");
  expect_error("{% set x = 1 %}{% set x.y = 2 %}", Kind::kRuntime, 1, "non-namespace");
  expect_error("{% if false %}{{ x|nosuchfilter }}{% else %}\n{{ y|nosuchfilter }}{% endif %}", Kind::kRuntime, 2,
               "No filter named 'nosuchfilter'");
}

TEST(JinjaErrors, RaiseExceptionCarriesTheMessage) {
  TemplateError e = render_error("{% if true %}\n  {{ raise_exception('Bad role: ' ~ 'x') }}\n{% endif %}");
  EXPECT_EQ(e.kind(), Kind::kRaised);
  EXPECT_EQ(e.detail(), "Bad role: x");
  EXPECT_EQ(e.line(), 2);
}

TEST(JinjaErrors, InfiniteRecursionStopsAtTheCallDepth) {
  expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", Kind::kLimit, 1, "recursion depth");
  // Exponential fan-out is stopped by the iteration budget before the depth limit.
  RenderLimits limits;
  limits.max_loop_iterations = 100000;
  expect_error("{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
               Kind::kLimit, 1, "loop iterations", limits);
  expect_error("{% set t = [{'k': [{'k': []}]}] %}{% for n in t recursive %}{{ loop(t) }}{% endfor %}", Kind::kLimit, 1,
               "recursion depth");
}

TEST(JinjaErrors, RunawayLoopsStopAtTheIterationBudget) {
  RenderLimits limits;
  limits.max_loop_iterations = 300'000;
  expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", Kind::kLimit, 1,
               "loop iterations", limits);
}

TEST(JinjaErrors, OutputAndStringSizesAreCapped) {
  RenderLimits limits;
  limits.max_output_bytes = 10000;
  expect_error("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", Kind::kLimit, 1, "output", limits);
  expect_error("{{ 'x' * 1000000000000 }}", Kind::kLimit, 1, "limit");
  expect_error("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
               Kind::kLimit, 1, "exceeds the limit", limits);
  expect_error("{{ [0] * 100000000000 }}", Kind::kLimit, 1, "10 million");
}

TEST(JinjaErrors, DeeplyNestedValuesFailCleanly) {
  TemplateError e = render_error(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}");
  EXPECT_EQ(e.kind(), Kind::kRuntime);
  EXPECT_NE(std::string(e.what()).find("recursion"), std::string::npos) << e.what();
  e = render_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
  EXPECT_NE(std::string(e.what()).find("recursion"), std::string::npos) << e.what();
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 2000; ++i) deep = nlohmann::json::array({deep});
  EXPECT_THROW(from_json(deep), TemplateError);
}

TEST(JinjaErrors, InvalidUtf8TemplateIsRejected) {
  try {
    Template::parse("ok \xff\xfe", "bad.jinja");
    FAIL();
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind(), Kind::kSyntax);
    EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos);
  }
}

// transformers' strftime_now(format): datetime.now().strftime(format), local time.
TEST(JinjaGlobals, StrftimeNowFormatsTheLocalTime) {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char year[16];
  std::strftime(year, sizeof year, "%Y", &local);
  EXPECT_EQ(Template::parse("{{ strftime_now('%Y') }}|{{ strftime_now('%d %B %Y')|length > 8 }}", "t").render({}),
            std::string(year) + "|True");
}

TEST(JinjaErrors, TemplateErrorIsAMoeserveError) {
  EXPECT_THROW(Template::parse("{% if %}", "x").render({}), moeserve::Error);
  EXPECT_THROW(Template::parse("{{ raise_exception('x') }}", "x").render({}), moeserve::Error);
}

// Rendering only reads the parsed template: one Template serves concurrent requests.
TEST(JinjaConcurrency, OneTemplateRendersOnManyThreads) {
  Template t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m|length %}{{ loop.index }}:{{ m }};"
      "{% endfor %}{{ ns.n }}",
      "shared");
  std::vector<std::string> outputs(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      std::vector<Value> items;
      for (int k = 0; k <= i; ++k) items.push_back(Value::string(std::string(static_cast<size_t>(k + 1), 'a')));
      for (int repeat = 0; repeat < 200; ++repeat)
        outputs[i] = t.render({{"messages", Value::sequence(items)}});
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(outputs[0], "1:a;1");
  EXPECT_EQ(outputs[2], "1:a;2:aa;3:aaa;6");
  EXPECT_EQ(outputs[7].substr(outputs[7].size() - 3), ";36");
}

}  // namespace
}  // namespace moeserve::text::jinja
