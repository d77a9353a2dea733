// UTF-8 validation and lossy decoding (expected values from the Unicode Standard, section 3.9
// "U+FFFD Substitution of Maximal Subparts", and RFC 3629), normalization (UnicodeData
// decompositions), character classes, and GPT-2's byte-level alphabet.
#include <gtest/gtest.h>

#include "core/error.h"
#include "text/bpe_byte_level.h"
#include "text/unicode.h"

namespace moeserve::text {
namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(find_invalid_utf8(""), std::nullopt);
  EXPECT_EQ(find_invalid_utf8("plain ASCII text that is longer than eight bytes"), std::nullopt);
  EXPECT_EQ(find_invalid_utf8("\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x8D\x95"), std::nullopt);  // é 你 🍕
  EXPECT_EQ(find_invalid_utf8("\xF4\x8F\xBF\xBF"), std::nullopt);                       // U+10FFFF
  EXPECT_EQ(find_invalid_utf8("abc\xFF"), 3u);
  EXPECT_EQ(find_invalid_utf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xE0\x80\xAF"), 0u);      // overlong '/'
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);     // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ab\xE2\x82"), 2u);        // truncated
  EXPECT_EQ(find_invalid_utf8("\x80"), 0u);              // lone continuation byte
  EXPECT_EQ(find_invalid_utf8(std::string(21, 'a') + "\xC3"), 21u);  // after the 8-byte fast path
}

TEST(Utf8, CheckNamesTheByteOffset) {
  try {
    check_utf8("hello\xC3(", "the prompt");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("byte offset 5"), std::string::npos) << e.what();
  }
}

TEST(Utf8, LossyDecodingReplacesMaximalSubparts) {
  // The example of the Unicode Standard (Table 3-8): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  const std::string bytes = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string expected = "a" + kFFFD + kFFFD + kFFFD + "b" + kFFFD + "c" + kFFFD + kFFFD + "d";
  EXPECT_EQ(utf8_lossy(bytes), expected);
  // Sequences that are ill-formed from their second byte: each byte is its own subpart.
  EXPECT_EQ(utf8_lossy("\xE0\x80\x80"), kFFFD + kFFFD + kFFFD);
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x8D"), kFFFD);  // a truncated emoji is one subpart
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x8D\x95"), "\xF0\x9F\x8D\x95");
  EXPECT_EQ(utf8_lossy("\xC3" "a"), kFFFD + "a");
}

TEST(Utf8, StreamingDecoderAgreesWithWholeStringForEveryChunking) {
  const std::string bytes =
      "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64\xF0\x9F\x8D\x95\xE4\xBD\xA0\xF0\x9F";
  const std::string whole = utf8_lossy(bytes);
  // Every split into two chunks, and byte by byte.
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    Utf8LossyDecoder decoder;
    std::string out;
    decoder.feed(std::string_view(bytes).substr(0, cut), out);
    decoder.feed(std::string_view(bytes).substr(cut), out);
    decoder.finish(out);
    EXPECT_EQ(out, whole) << "cut at " << cut;
  }
  Utf8LossyDecoder decoder;
  std::string out;
  for (char c : bytes) {
    const size_t before = out.size();
    decoder.feed(std::string_view(&c, 1), out);
    // Whatever came out so far is complete characters.
    EXPECT_EQ(find_invalid_utf8(std::string_view(out).substr(before)), std::nullopt);
  }
  EXPECT_EQ(decoder.pending_bytes(), 2u);  // F0 9F
  decoder.finish(out);
  EXPECT_EQ(out, whole);
}

TEST(Unicode, NormalizationForms) {
  EXPECT_EQ(normalize_unicode("e\xCC\x81", NormalForm::NFC), "\xC3\xA9");  // e + U+0301 -> é
  EXPECT_EQ(normalize_unicode("\xC3\xA9", NormalForm::NFD), "e\xCC\x81");
  // Canonical ordering: dot below (ccc 220) goes before dot above (ccc 230).
  EXPECT_EQ(normalize_unicode("q\xCC\x87\xCC\xA3", NormalForm::NFC), "q\xCC\xA3\xCC\x87");
  // Conjoining jamo compose into a syllable: U+1100 U+1161 U+11A8 -> U+AC01.
  EXPECT_EQ(normalize_unicode("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", NormalForm::NFC),
            "\xEA\xB0\x81");
  EXPECT_EQ(normalize_unicode("\xE2\x84\xAB", NormalForm::NFC), "\xC3\x85");  // U+212B -> U+00C5
  EXPECT_EQ(normalize_unicode("\xEF\xAC\x81", NormalForm::NFKC), "fi");       // U+FB01
  EXPECT_EQ(normalize_unicode("\xEF\xAC\x81", NormalForm::NFC), "\xEF\xAC\x81");
  EXPECT_EQ(normalize_unicode("\xE2\x91\xA0", NormalForm::NFKD), "1");        // U+2460
  // Latin-1 text is already NFC (fast path) but not NFD.
  EXPECT_EQ(normalize_unicode("caf\xC3\xA9", NormalForm::NFC), "caf\xC3\xA9");
  EXPECT_EQ(normalize_unicode("caf\xC3\xA9", NormalForm::NFD), "cafe\xCC\x81");
  EXPECT_EQ(normalize_unicode(std::string("a\0b", 3), NormalForm::NFC), std::string("a\0b", 3));
}

TEST(Unicode, WhitespaceIsTheWhiteSpaceProperty) {
  for (char32_t cp : std::initializer_list<char32_t>{0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A,
                      0x2028, 0x2029, 0x202F, 0x205F, 0x3000})
    EXPECT_TRUE(is_unicode_whitespace(cp)) << std::hex << static_cast<uint32_t>(cp);
  for (char32_t cp : std::initializer_list<char32_t>{0x08, 'a', 0x200B, 0x200D, 0xFEFF, 0x180E, 0x2060})
    EXPECT_FALSE(is_unicode_whitespace(cp)) << std::hex << static_cast<uint32_t>(cp);
}

TEST(Unicode, WordCharactersFollowRustRegexW) {
  for (char32_t cp : std::initializer_list<char32_t>{'a', 'Z', '0', '_', 0xE9, 0x0301, 0x0660, 0x4E2D, 0x200D, 0x24B6, 0x2160,
                      0x0915, 0x093F})
    EXPECT_TRUE(is_unicode_word_char(cp)) << std::hex << static_cast<uint32_t>(cp);
  for (char32_t cp : std::initializer_list<char32_t>{'-', ' ', ',', 0xB2, 0x25CC, 0x1F355, 0x2028})
    EXPECT_FALSE(is_unicode_word_char(cp)) << std::hex << static_cast<uint32_t>(cp);
}

TEST(ByteLevel, Gpt2Alphabet) {
  EXPECT_EQ(byte_level_char(' '), U'\u0120');   // Ġ
  EXPECT_EQ(byte_level_char('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(byte_level_char(0), U'\u0100');
  EXPECT_EQ(byte_level_char('A'), U'A');
  EXPECT_EQ(byte_level_char(0x7F), U'\u0121');
  EXPECT_EQ(byte_level_char(0xA0), U'\u0142');
  EXPECT_EQ(byte_level_char(0xAD), U'\u0143');
  EXPECT_EQ(byte_level_char(0xE9), U'\u00E9');
  for (int b = 0; b < 256; ++b) {
    auto back = byte_level_byte(byte_level_char(static_cast<uint8_t>(b)));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, b);
  }
  EXPECT_EQ(bytes_to_byte_level(" hi\n"), "\xC4\xA0hi\xC4\x8A");
  std::string bytes;
  EXPECT_TRUE(byte_level_to_bytes("\xC4\xA0hi\xC4\x8A", bytes));
  EXPECT_EQ(bytes, " hi\n");
  bytes.clear();
  EXPECT_FALSE(byte_level_to_bytes("x\xE4\xBD\xA0", bytes));  // 你 is not in the alphabet
  EXPECT_TRUE(bytes.empty());
}

}  // namespace
}  // namespace moeserve::text
