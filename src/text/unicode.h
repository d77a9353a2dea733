// UTF-8 and Unicode helpers for the tokenizer: validation (with the byte offset of the first
// bad byte), code point iteration, lossy decoding that replaces invalid sequences with U+FFFD
// exactly as Rust's String::from_utf8_lossy and the WHATWG TextDecoder do (one U+FFFD per
// "maximal subpart", Unicode 15 section 3.9), Unicode normalization forms (utf8proc), and the
// two character classes Hugging Face's added-token matching uses (regex \s and \w).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::text {

// Byte offset of the first byte that starts an invalid or truncated UTF-8 sequence, or
// nullopt when `bytes` is valid UTF-8 (overlong forms, surrogates and code points above
// U+10FFFF are invalid).
std::optional<size_t> find_invalid_utf8(std::string_view bytes);

// Throws moeserve::Error "invalid UTF-8 in <what> at byte offset N" unless `bytes` is valid.
void check_utf8(std::string_view bytes, std::string_view what);

// Number of bytes of the UTF-8 sequence whose first byte is `lead` (1 for bytes that cannot
// start a sequence, so that a scan always advances).
inline size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return lead < 0xF8 ? 4 : 1;
}

// Decodes the code point starting at text[pos] of VALID UTF-8 and advances pos past it.
char32_t next_code_point(std::string_view text, size_t& pos);

// The code point that ends at text[end-1] of VALID UTF-8 (end > 0).
char32_t last_code_point(std::string_view text, size_t end);

void append_utf8(std::string& out, char32_t cp);

// Incremental lossy UTF-8 decoder. Bytes go in, and only complete characters come out: a
// sequence that may still be completed by later bytes is held back, and a sequence that can no
// longer become valid is replaced by U+FFFD (one per maximal subpart). feed() over any
// chunking of a byte string followed by finish() produces the same text as utf8_lossy() of
// the whole string.
class Utf8LossyDecoder {
 public:
  // Appends the characters completed by `bytes` to `out`.
  void feed(std::string_view bytes, std::string& out);
  // Flushes a held-back truncated sequence as U+FFFD and resets the decoder.
  void finish(std::string& out);
  // Bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_len_; }

 private:
  unsigned char pending_[4] = {};
  size_t pending_len_ = 0;
};

// `bytes` with every invalid sequence replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);

enum class NormalForm { NFC, NFD, NFKC, NFKD };

// `text` (valid UTF-8) in the given normalization form. Text that is already in that form is
// detected cheaply (ASCII for every form; every code point below U+0300 for NFC).
std::string normalize_unicode(std::string_view text, NormalForm form);

// Unicode White_Space property (what Rust's char::is_whitespace and regex \s test).
bool is_unicode_whitespace(char32_t cp);

// Unicode word character as Rust regex \w defines it: Alphabetic, Mark, Decimal_Number,
// Connector_Punctuation or Join_Control. Alphabetic is derived from the general category
// (letters and letter numbers) plus the symbol blocks that carry Other_Alphabetic (circled and
// squared Latin letters); the other Other_Alphabetic code points are marks, already covered.
bool is_unicode_word_char(char32_t cp);

}  // namespace moeserve::text
