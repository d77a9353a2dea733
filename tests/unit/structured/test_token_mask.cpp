// Token masks: the trie walk (with the plain-string shortcut and the cache) allows exactly the
// tokens whose bytes the matcher takes one by one, on a small vocabulary and on Qwen3's.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "structured/json_schema_compiler.h"
#include "structured/token_mask.h"
#include "structured_test_util.h"
#include "text/tokenizer.h"
#include "text/tokenizer_added_tokens.h"

namespace moeserve::structured {
namespace {

// The reference: feed each token's bytes to the matcher.
TokenMask brute_force(const TokenMasker& masker, const MatchState& state) {
  TokenMask mask(masker.vocab().mask_words(), 0);
  for (int64_t t = 0; t < masker.vocab().size(); ++t) {
    const std::string* bytes = masker.vocab().bytes(int32_t(t));
    if (!bytes) continue;
    MatchState s = state;
    if (masker.matcher().feed_all(s, *bytes)) mask[size_t(t / 64)] |= uint64_t(1) << (t % 64);
  }
  return mask;
}

size_t count(const TokenMask& mask) {
  size_t n = 0;
  for (uint64_t w : mask) n += size_t(__builtin_popcountll(w));
  return n;
}

// Checks the masks at every prefix of `text` (a text of `masker`'s grammar).
void check_masks_along(const TokenMasker& masker, const std::string& text) {
  MatchState state = masker.matcher().start();
  for (size_t i = 0; i <= text.size(); ++i) {
    const TokenMask fast = masker.compute(state);
    const TokenMask reference = brute_force(masker, state);
    ASSERT_EQ(fast, reference) << "after " << i << " bytes of " << text << ": " << count(fast) << " vs "
                               << count(reference) << " tokens";
    EXPECT_EQ(*masker.allowed(state), reference);
    if (i < text.size()) ASSERT_TRUE(masker.matcher().feed_all(state, text.substr(i, 1)));
  }
}

std::shared_ptr<const TokenVocabulary> small_vocabulary() {
  const std::vector<std::string> pieces = {
      "{", "}", "[", "]", ":", ",", "\"", "{\"", "\":", "\":\"", "\",\"", "\"}", "\"]", "}}", "]}", " ", "  ", "\n",
      "\n  ", "a", "b", "ab", "abc", "name", "age", "true", "tr", "ue", "false", "null", "nu", "0", "1", "12",
      "-", ".", "5", "e", "E+", "\\", "\\\"", "\\n", "\\u", "00e9", "\xC3", "\xA9", "\xC3\xA9", "\xE6\x97\xA5",
      "\xE6\x97", "\xA5", "\xF0\x9F", "\x98\x80", "x\"", "\"x", " \"", "\t", "\x01", "}\n", "1,", "[\"",
  };
  std::vector<std::optional<std::string>> tokens;
  for (const auto& p : pieces) tokens.push_back(p);
  tokens.push_back(std::nullopt);  // an id structured output does not use (e.g. an added token)
  return std::make_shared<TokenVocabulary>(tokens, int64_t(tokens.size()) + 5);  // the model's vocab is larger
}

TEST(TokenVocabulary, PlainStringCharacters) {
  EXPECT_EQ(plain_string_chars("abc"), 3);
  EXPECT_EQ(plain_string_chars(""), 0);
  EXPECT_EQ(plain_string_chars("caf\xC3\xA9"), 4);
  EXPECT_EQ(plain_string_chars("\xF0\x9F\x98\x80!"), 2);
  EXPECT_EQ(plain_string_chars("a\"b"), -1);
  EXPECT_EQ(plain_string_chars("a\\n"), -1);
  EXPECT_EQ(plain_string_chars("a\n"), -1);
  EXPECT_EQ(plain_string_chars("\xC3"), -1);          // partial
  EXPECT_EQ(plain_string_chars("\xA9"), -1);          // continuation alone
  EXPECT_EQ(plain_string_chars("\xED\xA0\x80"), -1);  // surrogate
  EXPECT_EQ(plain_string_chars("\xC0\x80"), -1);      // overlong
}

TEST(TokenVocabulary, TrieHoldsEveryUsableTokenOnce) {
  const auto vocab = small_vocabulary();
  std::vector<int> seen(size_t(vocab->size()), 0);
  for (const TokenTrie* trie : {&vocab->all(), &vocab->not_plain()})
    for (size_t i = 0; i < trie->nodes.size(); ++i) {
      const TrieNode& n = trie->nodes[i];
      ASSERT_GT(n.skip, i);
      ASSERT_LE(n.skip, trie->nodes.size());
      if (trie == &vocab->all())
        for (uint32_t k = n.tokens_begin; k < n.tokens_end; ++k) ++seen[size_t(trie->token_ids[k])];
    }
  for (int64_t t = 0; t < vocab->size(); ++t) EXPECT_EQ(seen[size_t(t)], vocab->bytes(int32_t(t)) ? 1 : 0) << t;
}

TEST(TokenMasker, SmallVocabularyMatchesBruteForce) {
  const auto vocab = small_vocabulary();
  const TokenMasker object_masker(any_json_object(), vocab);
  for (const char* text : {R"({"name":"ab\u00e9 \"x\" é日😀","age":[12,-0.5e+3,true,null],"x":{}})",
                           "{\n  \"a\": \"b\"}", R"({"tr":false})"})
    check_masks_along(object_masker, text);
  const TokenMasker limited(compile_json_schema(nlohmann::ordered_json::parse(
                                R"({"type":"object","properties":{"name":{"type":"string","maxLength":4}}})")),
                            vocab);
  check_masks_along(limited, R"({"name":"a\ncé"})");  // 4 characters
}

TEST(TokenMasker, CacheKeepsTheMostRecentMasks) {
  const TokenMasker masker(any_json_object(), small_vocabulary(), /*max_cached=*/2);
  const JsonMatcher& m = masker.matcher();
  MatchState a = m.start(), b = m.start(), c = m.start();
  ASSERT_TRUE(m.feed_all(b, "{"));
  ASSERT_TRUE(m.feed_all(c, "{\"k"));
  const auto first = masker.allowed(a);
  EXPECT_EQ(masker.allowed(a), first);  // the same object: a cache hit
  masker.allowed(b);
  masker.allowed(a);  // a is now the most recent
  masker.allowed(c);  // evicts b
  EXPECT_EQ(masker.cached(), 2u);
  EXPECT_EQ(masker.allowed(a), first);
  EXPECT_EQ(*masker.allowed(b), masker.compute(b));
}

std::optional<text::Tokenizer> qwen3_tokenizer() {
  const auto dir = std::filesystem::path(MOESERVE_SOURCE_DIR) / "third_party/tokenizers/qwen3";
  if (!std::filesystem::exists(dir / "tokenizer.json")) return std::nullopt;
  return text::Tokenizer::load(dir);
}

TEST(TokenMasker, Qwen3VocabularyMatchesBruteForce) {
  const auto tokenizer = qwen3_tokenizer();
  if (!tokenizer) GTEST_SKIP() << "third_party/tokenizers/qwen3 missing: run scripts/install-deps.sh";
  // Qwen3.5's embedding rows outnumber the tokenizer's ids; the extra ids are never allowed.
  const auto vocab = TokenVocabulary::from_tokenizer(*tokenizer, tokenizer->vocab_size() + 100);
  for (const auto& added : tokenizer->added_tokens()) EXPECT_EQ(vocab->bytes(added.id), nullptr) << added.content;
  const TokenMasker masker(any_json_object(), vocab);
  check_masks_along(masker, "{\"answer\": \"Paris est la capitale, \\\"ville\\\" \xE6\x97\xA5.\", \"n\": [1, 2.5]}");
  const TokenMasker schema_masker(
      compile_json_schema(nlohmann::ordered_json::parse(R"({"type":"object","properties":{
          "city":{"type":"string","maxLength":6},"ok":{"type":"boolean"}},"required":["city","ok"]})")),
      vocab);
  check_masks_along(schema_masker, "{\"city\": \"Lyon\", \"ok\": true}");
  const TokenMasker pattern_masker(
      compile_json_schema(nlohmann::ordered_json::parse(R"({"type":"object","properties":{
          "code":{"type":"string","pattern":"^[A-Z]{3}-\\d+$"},"n":{"type":"integer","minimum":-5,"maximum":120}},
          "required":["code","n"]})")),
      vocab);
  check_masks_along(pattern_masker, "{\"code\": \"ABC-42\", \"n\": 107}");
  // Between tokens few tokens fit; inside a string most do.
  MatchState s = masker.matcher().start();
  const size_t at_start = count(masker.compute(s));
  ASSERT_TRUE(masker.matcher().feed_all(s, "{\"k\": \"v"));
  const size_t in_string = count(masker.compute(s));
  EXPECT_LT(at_start, 1000u);  // whitespace runs, "{", "{\"", ...
  EXPECT_GT(in_string, size_t(tokenizer->vocab_size()) / 2);
}

}  // namespace
}  // namespace moeserve::structured
