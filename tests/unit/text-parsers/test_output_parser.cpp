// The combined OutputParser: reasoning first, then tool calls on the content only.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parser_test_util.h"
#include "text/output_parser.h"

namespace moeserve::text {
namespace {

using testutil::Message;
using testutil::OutputSetup;

Message parse(const OutputSetup& s, std::string_view text) {
  testutil::expect_split_invariant(s, text);
  return testutil::one_shot(s, text);
}

const char* kXmlCall =
    "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>";

// A tool call written inside the think block is part of the reasoning: the Qwen3.5
// template renders calls after "</think>", so only those are calls.
TEST(OutputParser, ToolCallsInsideThinkAreReasoning) {
  const OutputSetup s{"qwen3", "qwen3", nullptr, /*prompt_ends_in_think=*/true};
  const std::string inside = std::string("I could call ") + kXmlCall + " but let me think more.";
  const std::string text = inside + "\n</think>\n\n" + kXmlCall;
  const Message m = parse(s, text);
  EXPECT_EQ(m.reasoning, inside + "\n");
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], (ToolCall{"call_0", "get_time", R"({"zone":"UTC"})"}));

  // Never closed: all reasoning, no call.
  const Message open = parse(s, inside);
  EXPECT_EQ(open, (Message{inside, "", {}}));

  // Qwen3 style (the model opens the block) behaves the same.
  const OutputSetup q3{"qwen3", "hermes", nullptr, false};
  const std::string hermes = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const Message m3 = parse(q3, "<think>\nmaybe " + hermes + "\n</think>\n\n" + hermes);
  EXPECT_EQ(m3.reasoning, "\nmaybe " + hermes + "\n");
  EXPECT_EQ(m3.tool_calls, (std::vector<ToolCall>{{"call_0", "get_time", "{}"}}));
}

TEST(OutputParser, ThinkContentAndCalls) {
  const OutputSetup s{"qwen3", "qwen3_coder", nullptr, true};
  const Message m = parse(s, std::string("Need the time.\n</think>\n\nChecking the clock.\n\n") + kXmlCall);
  EXPECT_EQ(m, (Message{"Need the time.\n", "\n\nChecking the clock.", {{"call_0", "get_time", R"({"zone":"UTC"})"}}}));
  EXPECT_TRUE(OutputParser("qwen3", "qwen3", nullptr, true).result().tool_calls.empty());
}

TEST(OutputParser, FinishReasonAndResult) {
  OutputParser p("qwen3", "qwen3", nullptr, true, testutil::counting_ids());
  p.push("ok</think>");
  EXPECT_FALSE(p.result().finished_with_tool_calls());
  p.push(kXmlCall);
  p.finish();
  EXPECT_TRUE(p.result().finished_with_tool_calls());
  EXPECT_EQ(p.result().reasoning_content, "ok");
  EXPECT_EQ(p.result().content, "");
  EXPECT_TRUE(p.finish().empty());  // idempotent
  EXPECT_EQ(p.result().tool_calls.size(), 1u);
  EXPECT_THROW(p.push("more"), Error);
}

TEST(OutputParser, WithoutParsers) {
  const std::string text = std::string("<think>r</think>") + kXmlCall;
  EXPECT_EQ(parse({"none", "none", nullptr, false}, text), (Message{"", text, {}}));
  EXPECT_EQ(parse({"", "", nullptr, true}, text), (Message{"", text, {}}));
  // Tool parser only: tags of the think block are content.
  EXPECT_EQ(parse({"none", "qwen3", nullptr, false}, text),
            (Message{"", "<think>r</think>", {{"call_0", "get_time", R"({"zone":"UTC"})"}}}));
  // Reasoning parser only.
  EXPECT_EQ(parse({"qwen3", "none", nullptr, false}, text), (Message{"r", kXmlCall, {}}));
}

TEST(OutputParser, TruncatedInsideACall) {
  // max_tokens hit inside a call: the partial call is content, not lost.
  const OutputSetup s{"qwen3", "qwen3", nullptr, true};
  const std::string cut = "<tool_call>\n<function=get_time>\n<parameter=zone>\nUT";
  EXPECT_EQ(parse(s, "r</think>\n\n" + cut), (Message{"r", "\n\n" + cut, {}}));
}

TEST(OutputParser, UnknownNamesFail) {
  EXPECT_THROW(OutputParser("deepseek_r1", "none", nullptr, false), Error);
  EXPECT_THROW(OutputParser("none", "mistral", nullptr, false), Error);
  EXPECT_THROW(OutputParser("qwen3", "qwen3", nlohmann::json::parse("[1]"), false), Error);
}

}  // namespace
}  // namespace moeserve::text
