// Pre-tokenizer: the split behaviors (expected pieces from the HF tokenizers documentation of
// SplitDelimiterBehavior: "the-final--countdown" split on "-"), the Qwen split regex, ByteLevel
// with add_prefix_space and the GPT-2 pattern, and load-time errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/pretokenizer.h"
#include "text/pretokenizer_regex.h"

namespace moeserve::text {
namespace {

using nlohmann::json;
using Pieces = std::vector<std::string>;

Pieces split_with(const json& config, std::string_view text) {
  PreTokenizer pre = PreTokenizer::from_json(config, "test pre_tokenizer");
  PreTokenizedPieces out;
  pre.split(text, out);
  return Pieces(out.pieces.begin(), out.pieces.end());
}

json dash_split(const char* behavior, bool invert = false) {
  return json{{"type", "Split"},
              {"pattern", {{"String", "-"}}},
              {"behavior", behavior},
              {"invert", invert}};
}

TEST(PreTokenizer, SplitBehaviors) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(split_with(dash_split("Removed"), text), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(split_with(dash_split("Isolated"), text),
            (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split_with(dash_split("MergedWithPrevious"), text),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split_with(dash_split("MergedWithNext"), text),
            (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split_with(dash_split("Contiguous"), text),
            (Pieces{"the", "-", "final", "--", "countdown"}));
  // The Python spelling is accepted too.
  EXPECT_EQ(split_with(dash_split("merged_with_previous"), text),
            (Pieces{"the-", "final-", "-", "countdown"}));
}

TEST(PreTokenizer, InvertKeepsTheMatchesWhenRemoving) {
  const json config = {{"type", "Split"},
                       {"pattern", {{"Regex", "\\d+"}}},
                       {"behavior", "Removed"},
                       {"invert", true}};
  EXPECT_EQ(split_with(config, "ab12cd3"), (Pieces{"12", "3"}));
}

TEST(PreTokenizer, QwenSplitRegex) {
  const json config = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
            "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(split_with(config, "Hello world's  \n\n  x"),
            (Pieces{"Hello", " world", "'s", "  \n\n", " ", " x"}));
  EXPECT_EQ(split_with(config, "I'LL pay 1234!"),
            (Pieces{"I", "'LL", " pay", " ", "1", "2", "3", "4", "!"}));
  EXPECT_EQ(split_with(config, ""), Pieces{});
  PreTokenizer pre = PreTokenizer::from_json(config, "test");
  EXPECT_TRUE(pre.byte_level());
}

TEST(PreTokenizer, ByteLevelWithGpt2PatternAndPrefixSpace) {
  const json config = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(split_with(config, "Hello world"), (Pieces{" Hello", " world"}));
  EXPECT_EQ(split_with(config, " Hello"), (Pieces{" Hello"}));  // already starts with a space
  EXPECT_EQ(split_with(config, "it's 42!!"), (Pieces{" it", "'s", " 42", "!!"}));
  const json no_prefix = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
  EXPECT_EQ(split_with(no_prefix, "Hello   there"), (Pieces{"Hello", "  ", " there"}));
}

TEST(PreTokenizer, NullSplitsNothing) {
  EXPECT_EQ(split_with(json(), "a b c"), (Pieces{"a b c"}));
  EXPECT_FALSE(PreTokenizer::from_json(json(), "test").byte_level());
}

TEST(PreTokenizer, RejectsWhatItDoesNotImplement) {
  auto message = [](const json& config) {
    try {
      PreTokenizer::from_json(config, "tokenizer.json: pre_tokenizer");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"type", "Whitespace"}}).find("'Whitespace' is not supported"),
            std::string::npos);
  const std::string after_byte_level = message(
      {{"type", "Sequence"},
       {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Split"}, {"behavior", "Isolated"}}}}});
  EXPECT_NE(after_byte_level.find("pretokenizers[1]"), std::string::npos) << after_byte_level;
  EXPECT_NE(after_byte_level.find("ByteLevel must be the last"), std::string::npos);
  const std::string bad_regex = message(
      {{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L}"}}}, {"behavior", "Isolated"}});
  EXPECT_NE(bad_regex.find("pattern.Regex"), std::string::npos) << bad_regex;
  EXPECT_NE(bad_regex.find("pattern offset"), std::string::npos) << bad_regex;
  EXPECT_NE(message(dash_split("Sideways")).find("'Sideways'"), std::string::npos);
}

TEST(Regex, EmptyMatchesFollowOnigurumaIteration) {
  Regex regex("a*", Regex::Syntax::Pattern, "test");
  std::vector<MatchSpan> spans;
  regex.find_all("baac", spans);
  // An empty match right after the previous match ("aa" ends at 3) is skipped.
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].start, 0u);
  EXPECT_EQ(spans[0].end, 0u);
  EXPECT_EQ(spans[1].start, 1u);
  EXPECT_EQ(spans[1].end, 3u);
  EXPECT_EQ(spans[2].start, 4u);
  EXPECT_EQ(spans[2].end, 4u);
}

TEST(Regex, LongWhitespaceRunsAreLinear) {
  // 1 MB of spaces then a letter: one \s+(?!\S) match, no JIT stack exhaustion.
  Regex regex("\\s+(?!\\S)|\\s+|\\p{L}+", Regex::Syntax::Pattern, "test");
  std::string text(1 << 20, ' ');
  text += "x";
  std::vector<MatchSpan> spans;
  regex.find_all(text, spans);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].end, (1u << 20) - 1);
  EXPECT_EQ(spans[2].start, 1u << 20);
}

}  // namespace
}  // namespace moeserve::text
