// Added-token matching: leftmost-longest, and the lstrip / rstrip / single_word / normalized
// flags with the semantics HF tokenizers documents for AddedToken (expected splits as in HF's
// own examples: "<mask>" with single_word, "my" with lstrip+rstrip, Unicode spaces).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer_added_tokens.h"
#include "text/tokenizer_normalizer.h"

namespace moeserve::text {
namespace {

using nlohmann::json;
using Split = std::pair<std::string, int32_t>;  // text, token id (-1: plain text)

json token(int32_t id, const std::string& content, bool special, bool single_word = false,
           bool lstrip = false, bool rstrip = false, bool normalized = false) {
  return json{{"id", id},          {"content", content}, {"special", special},
              {"single_word", single_word}, {"lstrip", lstrip},   {"rstrip", rstrip},
              {"normalized", normalized}};
}

std::vector<Split> split_raw(const AddedVocabulary& vocab, std::string_view text) {
  std::vector<TextSegment> segments;
  vocab.split_raw(text, segments);
  std::vector<Split> out;
  for (const auto& s : segments) out.emplace_back(std::string(s.text), s.token_id);
  return out;
}

TEST(AddedTokens, LeftmostLongestWithoutFlags) {
  const Normalizer none = Normalizer::from_json(json(), "n");
  const auto vocab = AddedVocabulary::from_json(
      json::array({token(10, "<a>", true), token(11, "<a><b>", true), token(12, "b>", false)}),
      none, "added_tokens");
  EXPECT_EQ(split_raw(vocab, "x<a><b>y<a>b>"),
            (std::vector<Split>{{"x", -1}, {"<a><b>", 11}, {"y", -1}, {"<a>", 10}, {"b>", 12}}));
  EXPECT_EQ(split_raw(vocab, ""), std::vector<Split>{});
  EXPECT_EQ(split_raw(vocab, "plain"), (std::vector<Split>{{"plain", -1}}));
}

TEST(AddedTokens, SingleWordOnlyMatchesWholeWords) {
  const Normalizer none = Normalizer::from_json(json(), "n");
  const auto vocab = AddedVocabulary::from_json(
      json::array({token(0, "<mask>", false, /*single_word=*/true)}), none, "added_tokens");
  EXPECT_EQ(split_raw(vocab, "<mask> My name <mask> A<mask> <mask>ony <mask>"),
            (std::vector<Split>{{"<mask>", 0},
                                {" My name ", -1},
                                {"<mask>", 0},
                                {" A<mask> <mask>ony ", -1},
                                {"<mask>", 0}}));
  // Punctuation is not a word character; a combining mark is.
  EXPECT_EQ(split_raw(vocab, "<mask>, <mask>- \xE2\x97\x8C\xCC\xB0<mask>"),
            (std::vector<Split>{{"<mask>", 0},
                                {", ", -1},
                                {"<mask>", 0},
                                {"- \xE2\x97\x8C\xCC\xB0<mask>", -1}}));
}

TEST(AddedTokens, StripFlagsSwallowUnicodeWhitespace) {
  const Normalizer none = Normalizer::from_json(json(), "n");
  const auto vocab = AddedVocabulary::from_json(
      json::array({token(0, "<mask>", false, true, /*lstrip=*/true, /*rstrip=*/true)}), none,
      "added_tokens");
  // "\xE2\x80\x80" is U+2000 EN QUAD, a White_Space character.
  EXPECT_EQ(split_raw(vocab, "Hi <mask> there\t<mask>\t<mask>\xE2\x80\x80"),
            (std::vector<Split>{{"Hi", -1},
                                {" <mask> ", 0},
                                {"there", -1},
                                {"\t<mask>\t", 0},
                                {"<mask>\xE2\x80\x80", 0}}));
}

TEST(AddedTokens, LstripAndRstripSeparately) {
  const Normalizer none = Normalizer::from_json(json(), "n");
  const auto vocab = AddedVocabulary::from_json(
      json::array({token(1, "[L]", true, false, true, false),
                   token(2, "[R]", true, false, false, true)}),
      none, "added_tokens");
  EXPECT_EQ(split_raw(vocab, "a  [L]  b  [R]  c"),
            (std::vector<Split>{{"a", -1}, {"  [L]", 1}, {"  b  ", -1}, {"[R]  ", 2}, {"c", -1}}));
  // [R] took the spaces, so [L] finds none left to strip.
  EXPECT_EQ(split_raw(vocab, "[R]  [L]"), (std::vector<Split>{{"[R]  ", 2}, {"[L]", 1}}));
}

TEST(AddedTokens, NormalizedTokensMatchTheNormalizedText) {
  const Normalizer nfc = Normalizer::from_json(json{{"type", "NFC"}}, "normalizer");
  // "cafe" + U+0301 written decomposed: normalized to "café" before it is matched.
  const auto vocab = AddedVocabulary::from_json(
      json::array({token(5, "cafe\xCC\x81", false, false, false, false, /*normalized=*/true),
                   token(6, "<raw>", true)}),
      nfc, "added_tokens");
  EXPECT_TRUE(vocab.has_raw_patterns());
  EXPECT_TRUE(vocab.has_normalized_patterns());
  std::vector<TextSegment> segments;
  vocab.split_normalized("I like caf\xC3\xA9!", segments);
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_EQ(segments[1].token_id, 5);
  // The raw pass does not see normalized tokens.
  EXPECT_EQ(split_raw(vocab, "caf\xC3\xA9<raw>"),
            (std::vector<Split>{{"caf\xC3\xA9", -1}, {"<raw>", 6}}));
}

TEST(AddedTokens, LookupAndDefaults) {
  const Normalizer none = Normalizer::from_json(json(), "n");
  const auto vocab = AddedVocabulary::from_json(
      json::array({json{{"id", 7}, {"content", "<s>"}, {"special", true}},
                   json{{"id", 8}, {"content", "word"}},
                   json{{"id", 9}, {"content", ""}}}),  // empty: ignored, as HF does
      none, "added_tokens");
  ASSERT_EQ(vocab.tokens().size(), 2u);
  EXPECT_FALSE(vocab.find(7)->normalized);  // special tokens default to not normalized
  EXPECT_TRUE(vocab.find(8)->normalized);
  EXPECT_EQ(vocab.find("word"), 8);
  EXPECT_EQ(vocab.find(9), nullptr);
}

TEST(AddedTokens, BadEntriesNameTheirIndex) {
  const Normalizer none = Normalizer::from_json(json(), "n");
  try {
    AddedVocabulary::from_json(json::array({token(1, "a", true), json{{"content", "b"}}}), none,
                               "tokenizer.json: added_tokens");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("added_tokens[1].id"), std::string::npos) << e.what();
  }
  EXPECT_THROW(AddedVocabulary::from_json(json::array({token(1, "a", true), token(1, "b", true)}),
                                          none, "added_tokens"),
               Error);
  // An absurd id is rejected rather than sizing tables by it.
  EXPECT_THROW(AddedVocabulary::from_json(json::array({token(1 << 30, "a", true)}), none,
                                          "added_tokens"),
               Error);
}

}  // namespace
}  // namespace moeserve::text
