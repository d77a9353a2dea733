// Assistant turns rendered by the real Qwen3 and Qwen3.5 chat templates with Python Jinja2
// (template_cases.json, made by make_template_cases.py): the OutputParser (reasoning
// qwen3 + each applicable tool parser) must give back the message the template rendered,
// in one shot and streamed in every chunking.
#include <algorithm>
#include <fstream>

#include <gtest/gtest.h>

#include "parser_test_util.h"
#include "text/output_parser.h"

namespace moeserve::text {
namespace {

using Json = nlohmann::ordered_json;
using testutil::Message;
using testutil::OutputSetup;

const Json& fixture() {
  static const Json j = [] {
    const std::string path = std::string(MOESERVE_SOURCE_DIR) + "/tests/unit/text-parsers/template_cases.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    return Json::parse(in);
  }();
  return j;
}

std::vector<std::string> parsers_for(const std::string& template_name) {
  if (template_name == "qwen3") return {"hermes", "qwen3"};
  return {"qwen3_coder", "qwen3_xml", "qwen3"};
}

void check_case(const Json& c, const std::string& tool_parser) {
  const OutputSetup setup{"qwen3", tool_parser, nlohmann::json::parse(fixture()["tools"].dump()),
                          c["prompt_ends_in_think"].get<bool>()};
  const std::string generated = c["generated"];
  const Json& expected = c["expected"];
  const Message got = testutil::one_shot(setup, generated);

  EXPECT_EQ(got.reasoning, expected["reasoning_content"].get<std::string>());
  EXPECT_EQ(got.content, expected["content"].get<std::string>());
  const Json& calls = expected["tool_calls"];
  ASSERT_EQ(got.tool_calls.size(), calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].id, "call_" + std::to_string(i));
    EXPECT_EQ(got.tool_calls[i].name, calls[i]["name"].get<std::string>());
    ASSERT_TRUE(Json::accept(got.tool_calls[i].arguments)) << got.tool_calls[i].arguments;
    const Json args = Json::parse(got.tool_calls[i].arguments);
    EXPECT_EQ(args, calls[i]["arguments"]) << "got " << args.dump() << "\nexpected " << calls[i]["arguments"].dump();
  }
  testutil::expect_split_invariant(setup, generated, /*seeds=*/8);
}

TEST(TemplateCases, FixtureIsThere) {
  EXPECT_GE(fixture()["cases"].size(), 20u);
}

// One test per (template, parser) so a failure names both.
class TemplateCasesTest : public testing::TestWithParam<std::string> {};

TEST_P(TemplateCasesTest, OutputParserRecoversTheRenderedMessage) {
  const std::string tool_parser = GetParam();
  int checked = 0;
  for (const Json& c : fixture()["cases"]) {
    const std::vector<std::string> parsers = parsers_for(c["template"]);
    if (std::find(parsers.begin(), parsers.end(), tool_parser) == parsers.end()) continue;
    SCOPED_TRACE(c["name"].get<std::string>() + " with " + tool_parser);
    check_case(c, tool_parser);
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

INSTANTIATE_TEST_SUITE_P(Parsers, TemplateCasesTest, testing::Values("hermes", "qwen3", "qwen3_coder", "qwen3_xml"));

// Without a tool parser the same turns split into reasoning and content only: the calls
// stay in the content, byte for byte.
TEST(TemplateCases, ReasoningOnly) {
  for (const Json& c : fixture()["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const OutputSetup setup{"qwen3", "none", nullptr, c["prompt_ends_in_think"].get<bool>()};
    const std::string generated = c["generated"];
    const Message got = testutil::one_shot(setup, generated);
    EXPECT_EQ(got.reasoning, c["expected"]["reasoning_content"].get<std::string>());
    EXPECT_EQ(got.reasoning.size() + got.content.size() + std::string("</think>").size() +
                  (c["prompt_ends_in_think"].get<bool>() ? 0 : std::string("<think>").size()),
              generated.size());
    EXPECT_TRUE(got.tool_calls.empty());
  }
}

}  // namespace
}  // namespace moeserve::text
