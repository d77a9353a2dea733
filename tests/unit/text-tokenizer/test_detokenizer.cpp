// Streaming detokenizer on the real Qwen3 tokenizer: pushes never emit invalid UTF-8 or a
// U+FFFD that a later token would have completed, and pushes + flush equal decode() of all ids
// (itself checked against HF tokenizers in test_tokenizer_reference.cpp), for every prefix of
// multi-byte texts, with and without skip_special_tokens, and for random id sequences.
#include <gtest/gtest.h>

#include <random>

#include "text/bpe_byte_level.h"
#include "text/detokenizer.h"
#include "text/unicode.h"
#include "tokenizer_fixtures.h"

namespace moeserve::text {
namespace {

using namespace moeserve::text::testing;
using Ids = std::vector<int32_t>;

const std::string kFFFD = "\xEF\xBF\xBD";

const Tokenizer& qwen3() { return variant_tokenizer("qwen3"); }

const char* const kMultiByteTexts[] = {
    "Family: \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 and "
    "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x87\xAF\xF0\x9F\x87\xB5",
    "\xE6\xBC\xA2\xE5\xAD\x97\xE4\xBB\xAE\xE5\x90\x8D\xE4\xBA\xA4\xE3\x81\x98\xE3\x82\x8A",
    "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D"
    "\xE0\xA4\xA4\xE0\xA5\x87 \xEC\x95\x88\xEB\x85\x95",
    "<|im_start|>assistant\n<think>\n\xF0\x9F\xA4\x94</think>\n\n\xE7\xAD\x94\xE6\xA1\x88 42"
    "<|im_end|>",
};

// Pushes `ids` one by one; checks each piece; returns the concatenation including flush().
std::string stream(const Ids& ids, bool skip_special_tokens) {
  StreamingDetokenizer detok(qwen3(), skip_special_tokens);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    EXPECT_EQ(find_invalid_utf8(piece), std::nullopt) << "after id " << id;
    all += piece;
  }
  all += detok.flush();
  return all;
}

TEST(StreamingDetokenizer, EveryPrefixIsCleanAndMatchesDecode) {
  MOESERVE_REQUIRE_QWEN3();
  for (const char* text : kMultiByteTexts) {
    const Ids ids = qwen3().encode(text);
    for (size_t k = 0; k <= ids.size(); ++k) {
      StreamingDetokenizer detok(qwen3(), false);
      std::string pushed;
      for (size_t i = 0; i < k; ++i) {
        const std::string piece = detok.push(ids[i]);
        EXPECT_EQ(find_invalid_utf8(piece), std::nullopt);
        EXPECT_EQ(piece.find(kFFFD), std::string::npos)
            << "U+FFFD mid-stream after " << i + 1 << " ids of " << text;
        pushed += piece;
      }
      const Ids prefix(ids.begin(), ids.begin() + static_cast<long>(k));
      // Only the flush may hold a truncated character, which decode() shows as U+FFFD.
      EXPECT_EQ(pushed + detok.flush(), qwen3().decode(prefix)) << k << " ids of " << text;
    }
    EXPECT_EQ(stream(ids, false), normalize_unicode(text, NormalForm::NFC));
  }
}

TEST(StreamingDetokenizer, MultiByteCharacterSplitAcrossTokensIsHeldBack) {
  MOESERVE_REQUIRE_QWEN3();
  // The byte-level tokens of U+1F914 (F0 9F A4 94) taken one byte at a time.
  const std::string emoji = "\xF0\x9F\xA4\x94";
  Ids ids;
  for (unsigned char b : emoji) {
    auto id = qwen3().token_to_id(byte_level_char_utf8(b));
    ASSERT_TRUE(id.has_value());
    ids.push_back(*id);
  }
  StreamingDetokenizer detok(qwen3(), false);
  EXPECT_EQ(detok.push(ids[0]), "");
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.push(ids[2]), "");
  EXPECT_EQ(detok.pending_bytes(), 3u);
  EXPECT_EQ(detok.push(ids[3]), emoji);
  EXPECT_EQ(detok.flush(), "");
}

TEST(StreamingDetokenizer, BytesThatCannotCompleteBecomeReplacementAtOnce) {
  MOESERVE_REQUIRE_QWEN3();
  auto byte_id = [](unsigned char b) { return *qwen3().token_to_id(byte_level_char_utf8(b)); };
  const Ids ids = {byte_id(0xE4), byte_id(0xBD), *qwen3().token_to_id("a"), byte_id(0x80),
                   byte_id(0xF0)};
  StreamingDetokenizer detok(qwen3(), false);
  EXPECT_EQ(detok.push(ids[0]), "");
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.push(ids[2]), kFFFD + "a");  // E4 BD cut short by 'a'
  EXPECT_EQ(detok.push(ids[3]), kFFFD);        // a lone continuation byte
  EXPECT_EQ(detok.push(ids[4]), "");
  EXPECT_EQ(detok.flush(), kFFFD);             // truncated at the end
  EXPECT_EQ(kFFFD + "a" + kFFFD + kFFFD, qwen3().decode(ids));
  // flush() starts a new stream.
  EXPECT_EQ(detok.push(*qwen3().token_to_id("a")), "a");
}

TEST(StreamingDetokenizer, SkipsSpecialTokens) {
  MOESERVE_REQUIRE_QWEN3();
  const Ids ids = qwen3().encode(kMultiByteTexts[3]);
  StreamingDetokenizer detok(qwen3(), true);
  EXPECT_EQ(detok.push(151644), "");  // <|im_start|>
  EXPECT_EQ(stream(ids, true), qwen3().decode(ids, true));
  EXPECT_EQ(stream(ids, true).find("<|im_start|>"), std::string::npos);
  EXPECT_NE(stream(ids, true).find("<think>"), std::string::npos);  // not a special token
  EXPECT_EQ(stream(ids, false), qwen3().decode(ids, false));
}

TEST(StreamingDetokenizer, RandomIdSequencesMatchDecode) {
  MOESERVE_REQUIRE_QWEN3();
  std::mt19937 rng(99);
  const int32_t vocab = qwen3().vocab_size();
  for (int trial = 0; trial < 300; ++trial) {
    Ids ids(std::uniform_int_distribution<size_t>(0, 40)(rng));
    for (int32_t& id : ids) {
      // Mostly single-byte tokens (to split characters), some of everything else, and a few
      // ids past the vocabulary.
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if (kind < 5) id = std::uniform_int_distribution<int32_t>(0, 255)(rng);
      else if (kind < 9) id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
      else id = std::uniform_int_distribution<int32_t>(vocab, vocab + 300)(rng);
    }
    const bool skip = trial % 2 == 0;
    EXPECT_EQ(stream(ids, skip), qwen3().decode(ids, skip)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace moeserve::text
