// Property test: seeded random strings over many scripts (letters, marks, digits, emoji with
// ZWJ/skin tones/flags, odd whitespace, added tokens) are encoded by moeserve and, at test
// time, by the npm port of HF tokenizers; ids and decodes must match, and decode(encode(x))
// must equal NFC(x) as JavaScript computes it. Skipped only when node or node_modules is
// missing.
#include <gtest/gtest.h>

#include <random>

#include "text/tokenizer.h"
#include "text/unicode.h"
#include "tokenizer_fixtures.h"

namespace moeserve::text {
namespace {

using namespace moeserve::text::testing;

struct Range {
  char32_t first, last;
  int weight;
};

// Blocks assigned long before Unicode 13, so every library involved (utf8proc, PCRE2, ICU in
// Node) agrees on their properties.
const Range kRanges[] = {
    {0x20, 0x7E, 40},      // ASCII
    {0x0A, 0x0A, 4},       // \n
    {0x0D, 0x0D, 1},       // \r
    {0x09, 0x09, 1},       // \t
    {0xA0, 0xFF, 3},       // Latin-1
    {0x100, 0x17F, 2},     // Latin Extended-A
    {0x300, 0x36F, 4},     // combining diacritics
    {0x391, 0x3C9, 2},     // Greek
    {0x410, 0x44F, 3},     // Cyrillic
    {0x5B0, 0x5BC, 1},     // Hebrew points
    {0x5D0, 0x5EA, 1},     // Hebrew letters
    {0x621, 0x64A, 2},     // Arabic letters
    {0x64B, 0x652, 1},     // Arabic harakat
    {0x660, 0x669, 1},     // Arabic-Indic digits
    {0x905, 0x939, 2},     // Devanagari letters
    {0x93E, 0x94D, 1},     // Devanagari vowel signs and virama
    {0xE01, 0xE3A, 1},     // Thai
    {0x1100, 0x1112, 1},   // Hangul leading jamo
    {0x1161, 0x1175, 1},   // Hangul vowel jamo
    {0xAC00, 0xD7A3, 2},   // Hangul syllables
    {0x3041, 0x3096, 2},   // Hiragana
    {0x30A1, 0x30FA, 2},   // Katakana
    {0x4E00, 0x9FA5, 5},   // CJK
    {0xFF01, 0xFF5E, 1},   // fullwidth forms
    {0x2000, 0x200D, 2},   // spaces, ZWSP, ZWNJ, ZWJ
    {0x2010, 0x2027, 1},   // general punctuation
    {0x2028, 0x2029, 1},   // line/paragraph separators
    {0x3000, 0x3000, 1},   // ideographic space
    {0xFEFF, 0xFEFF, 1},   // BOM
    {0xFE0F, 0xFE0F, 1},   // emoji presentation selector
    {0x1F300, 0x1F64F, 3}, // emoji
    {0x1F3FB, 0x1F3FF, 1}, // skin tones
    {0x1F1E6, 0x1F1FF, 1}, // regional indicators (flags)
};

const char* const kFragments[] = {
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|endoftext|>",
    "'s", "'LL", "'Ve", " 'd", "  ", "\r\n", "\n\n", "1234567", "e\xCC\x81", "\xE2\x80\x8D",
};

std::vector<std::string> random_texts(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  int total_weight = 0;
  for (const Range& r : kRanges) total_weight += r.weight;
  std::vector<std::string> texts;
  for (int t = 0; t < count; ++t) {
    std::string text;
    const int length = std::uniform_int_distribution<int>(0, 48)(rng);
    for (int i = 0; i < length; ++i) {
      if (std::uniform_int_distribution<int>(0, 19)(rng) == 0) {
        text += kFragments[std::uniform_int_distribution<size_t>(0, std::size(kFragments) - 1)(rng)];
        continue;
      }
      int pick = std::uniform_int_distribution<int>(0, total_weight - 1)(rng);
      const Range* range = kRanges;
      while (pick >= range->weight) pick -= (range++)->weight;
      const char32_t cp = std::uniform_int_distribution<uint32_t>(range->first, range->last)(rng);
      // A word-like run: repeat the code point's neighbourhood to build longer pieces.
      const int run = std::uniform_int_distribution<int>(1, 3)(rng);
      for (int k = 0; k < run; ++k) append_utf8(text, std::min<char32_t>(cp + k, range->last));
    }
    texts.push_back(std::move(text));
  }
  return texts;
}

bool has_added_token(const std::string& text) {
  for (const char* token : {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                            "<|endoftext|>"})
    if (text.find(token) != std::string::npos) return true;
  return false;
}

void check_against_oracle(const std::string& variant, uint32_t seed, int count) {
  const std::vector<std::string> texts = random_texts(seed, count);
  const nlohmann::json tokenizer_json =
      apply_variant(qwen3_tokenizer_json(), corpus().at("variants").at(variant));
  std::string why;
  auto oracle = run_node_oracle(tokenizer_json, texts, &why);
  if (!oracle) GTEST_SKIP() << "the npm oracle is unavailable: " << why;
  ASSERT_EQ(oracle->ids.size(), texts.size());
  const Tokenizer& tokenizer = variant_tokenizer(variant);
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer.encode(texts[i]);
    if (ids != oracle->ids[i] && ++mismatches <= 5) {
      ADD_FAILURE() << variant << " seed " << seed << " text #" << i << " ("
                    << nlohmann::json(texts[i]).dump() << "): ids differ from the npm oracle";
    }
    const std::string decoded = tokenizer.decode(ids);
    EXPECT_EQ(decoded, oracle->decoded[i]) << "text #" << i;
    // decode(encode(x)) == NFC(x), unless an added token was cut out first: normalization
    // then runs on each side separately (">" of "<think>" + U+0338 does not become U+226F).
    if (!has_added_token(texts[i])) EXPECT_EQ(decoded, oracle->nfc[i]) << "text #" << i;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(TokenizerRandom, Qwen3MatchesNpmOracleOnRandomMixedScripts) {
  MOESERVE_REQUIRE_QWEN3();
  check_against_oracle("qwen3", 20240601u, 400);
}

TEST(TokenizerRandom, Qwen35RegexMatchesNpmOracleOnRandomMixedScripts) {
  MOESERVE_REQUIRE_QWEN3();
  check_against_oracle("qwen35", 7u, 400);
}

}  // namespace
}  // namespace moeserve::text
