// Reasoning parser (qwen3): the split at <think>...</think>, the two prompt modes, and
// streaming with tags split anywhere.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parser_test_util.h"
#include "text/reasoning_parser.h"

namespace moeserve::text {
namespace {

struct Split {
  std::string reasoning;
  std::string content;
  bool operator==(const Split&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Split& s) {
  return os << "{reasoning=" << testing::PrintToString(s.reasoning) << ", content=" << testing::PrintToString(s.content)
            << "}";
}

Split one_shot(std::string_view text, bool in_think) {
  ReasoningParser::Delta d = ReasoningParser::parse(text, in_think);
  return {d.reasoning, d.content};
}

Split streamed(const std::vector<std::string>& chunks, bool in_think) {
  ReasoningParser parser(in_think);
  Split out;
  for (const std::string& c : chunks) {
    ReasoningParser::Delta d = parser.push(c);
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  ReasoningParser::Delta d = parser.finish();
  out.reasoning += d.reasoning;
  out.content += d.content;
  return out;
}

// Every split the streaming tests use gives the one-shot answer.
void expect_split_invariant(std::string_view text, bool in_think) {
  const Split expected = one_shot(text, in_think);
  for (const std::vector<std::string>& chunks : testutil::all_chunkings(text, /*seeds=*/16)) {
    ASSERT_EQ(streamed(chunks, in_think), expected) << "text=" << testing::PrintToString(std::string(text))
                                                    << " chunks=" << testutil::describe(chunks);
  }
}

// Qwen3 (model writes <think> itself): the assistant text the Qwen3 template renders for
// reasoning "R" and content "C" is "<think>\nR\n</think>\n\nC".
TEST(ReasoningParser, Qwen3ModelOpensTheBlock) {
  const std::string text = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?";
  EXPECT_EQ(one_shot(text, false), (Split{"\nThe user greets me.\n", "\n\nHello! How can I help?"}));
  expect_split_invariant(text, false);
}

// Qwen3.5: the prompt ends in "<think>\n", the output holds only "</think>".
TEST(ReasoningParser, Qwen35PromptOpensTheBlock) {
  const std::string text = "Two plus two is four.\n</think>\n\nThe answer is 4.";
  EXPECT_EQ(one_shot(text, true), (Split{"Two plus two is four.\n", "\n\nThe answer is 4."}));
  expect_split_invariant(text, true);
}

TEST(ReasoningParser, NoCloseTagMeansAllReasoning) {
  const std::string text = "Let me think about this carefully. First, </thin";
  EXPECT_EQ(one_shot(text, true), (Split{text, ""}));
  expect_split_invariant(text, true);
  // The same when the model opened the block itself.
  EXPECT_EQ(one_shot("<think>\nstill thinking", false), (Split{"\nstill thinking", ""}));
  expect_split_invariant("<think>\nstill thinking", false);
}

TEST(ReasoningParser, PlainContentWhenThePromptDidNotOpenABlock) {
  // enable_thinking=false renders "<think>\n\n</think>\n\n" into the prompt: the server
  // passes prompt_ends_in_think=false and everything is content.
  const std::string text = "Paris is the capital of France. The tag </think> here is just text.";
  EXPECT_EQ(one_shot(text, false), (Split{"", text}));
  expect_split_invariant(text, false);
  // A <think> that is not the first byte is content too.
  EXPECT_EQ(one_shot("Hi <think>x</think>", false), (Split{"", "Hi <think>x</think>"}));
  expect_split_invariant("Hi <think>x</think>", false);
}

TEST(ReasoningParser, RedundantOpenTagInThinkModeIsDropped) {
  EXPECT_EQ(one_shot("<think>\nR\n</think>\n\nC", true), (Split{"\nR\n", "\n\nC"}));
  expect_split_invariant("<think>\nR\n</think>\n\nC", true);
}

TEST(ReasoningParser, TagsAfterTheBlockAreContent) {
  const std::string text = "r</think>c<think>d</think>e";
  EXPECT_EQ(one_shot(text, true), (Split{"r", "c<think>d</think>e"}));
  expect_split_invariant(text, true);
}

TEST(ReasoningParser, EmptyAndEdgeInputs) {
  EXPECT_EQ(one_shot("", true), (Split{"", ""}));
  EXPECT_EQ(one_shot("", false), (Split{"", ""}));
  EXPECT_EQ(one_shot("</think>", true), (Split{"", ""}));
  EXPECT_EQ(one_shot("<think></think>", false), (Split{"", ""}));
  EXPECT_EQ(one_shot("<think>", false), (Split{"", ""}));
  EXPECT_EQ(one_shot("<thin", false), (Split{"", "<thin"}));
  EXPECT_EQ(one_shot("<thin", true), (Split{"<thin", ""}));
  EXPECT_EQ(one_shot("</think", true), (Split{"</think", ""}));
  for (const char* t : {"<think>", "</think>", "<thin", "<<think>>", "</think></think>", "<think><think>"}) {
    expect_split_invariant(t, true);
    expect_split_invariant(t, false);
  }
}

TEST(ReasoningParser, UnicodeIsKeptByteForByte) {
  const std::string text = "Überlegung: 東京は日本の首都 🚀\n</think>\n\n答え: 東京 ✓";
  EXPECT_EQ(one_shot(text, true), (Split{"Überlegung: 東京は日本の首都 🚀\n", "\n\n答え: 東京 ✓"}));
  expect_split_invariant(text, true);
}

// The parser holds back only the shortest suffix that could still become a tag.
TEST(ReasoningParser, HoldsBackOnlyAPossibleTagPrefix) {
  ReasoningParser parser(/*prompt_ends_in_think=*/true);
  ReasoningParser::Delta d = parser.push("abc</thi");
  EXPECT_EQ(d.reasoning, "abc");
  d = parser.push("s is not a tag <");
  EXPECT_EQ(d.reasoning, "</this is not a tag ");
  d = parser.push("<");
  EXPECT_EQ(d.reasoning, "<");  // "<<": the first '<' can no longer start the tag
  d = parser.push("/think");
  EXPECT_EQ(d.reasoning, "");
  d = parser.push(">");
  EXPECT_TRUE(d.empty());
  d = parser.push("x");
  EXPECT_EQ(d.content, "x");
  EXPECT_FALSE(parser.in_reasoning());

  ReasoningParser opening(/*prompt_ends_in_think=*/false);
  d = opening.push("<th");
  EXPECT_TRUE(d.empty());
  d = opening.push("ink>ok");
  EXPECT_EQ(d.reasoning, "ok");
  EXPECT_TRUE(opening.in_reasoning());

  ReasoningParser plain(/*prompt_ends_in_think=*/false);
  d = plain.push("<tx");
  EXPECT_EQ(d.content, "<tx");  // diverged from "<think>" at the second byte: emitted at once
}

TEST(ReasoningParser, RandomTextIsSplitInvariant) {
  // Random strings over an alphabet rich in tag fragments.
  std::mt19937 rng(1234);
  const std::vector<std::string> atoms = {"<", ">", "/", "think", "<think>", "</think>", "</", "th", "a", "\n", " ", "é"};
  for (int n = 0; n < 200; ++n) {
    std::string text;
    const int len = static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) text += atoms[rng() % atoms.size()];
    expect_split_invariant(text, n % 2 == 0);
  }
}

TEST(ReasoningParser, UnknownNameListsTheValidOnes) {
  EXPECT_NO_THROW(ReasoningParser::create("qwen3", true));
  try {
    ReasoningParser::create("deepseek", true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("qwen3"), std::string::npos);
  }
}

TEST(ReasoningParser, PromptEndsInOpenThink) {
  // Qwen3.5 generation prompt, thinking on / off; Qwen3 prompt (model opens the block).
  EXPECT_TRUE(prompt_ends_in_open_think("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_ends_in_open_think(
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_ends_in_open_think("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
  // A "<think>" in an earlier turn's text does not count.
  EXPECT_FALSE(prompt_ends_in_open_think("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n"));
  // Past assistant turns with closed blocks.
  EXPECT_FALSE(prompt_ends_in_open_think("<|im_start|>assistant\n<think>\nr\n</think>\n\nc<|im_end|>\n<|im_start|>user\nq"));
  EXPECT_TRUE(prompt_ends_in_open_think("<think>"));
  EXPECT_FALSE(prompt_ends_in_open_think(""));
}

}  // namespace
}  // namespace moeserve::text
