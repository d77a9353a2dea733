// The byte-level alphabet of GPT-2 style BPE (used by Qwen, Llama 3, ...). Every byte value is
// mapped to one printable Unicode character so that a vocabulary of strings can cover all byte
// sequences: the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to the code point of
// the same value, and the remaining 68 bytes (controls, space, 0x7F..0xA0, 0xAD) map, in
// increasing byte order, to U+0100, U+0101, ... So ' ' (0x20) becomes U+0120 'Ġ' and '\n'
// becomes U+010A 'Ċ'.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::text {

// The code point that stands for `byte`.
char32_t byte_level_char(uint8_t byte);

// The UTF-8 encoding of byte_level_char(byte).
std::string_view byte_level_char_utf8(uint8_t byte);

// The byte that code point `cp` stands for, or nullopt when `cp` is not in the alphabet.
std::optional<uint8_t> byte_level_byte(char32_t cp);

// Appends the bytes that the byte-level string `token` (valid UTF-8) stands for. Returns false
// and appends nothing when some character of `token` is outside the alphabet.
bool byte_level_to_bytes(std::string_view token, std::string& out);

// `bytes` written in the byte-level alphabet.
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace moeserve::text
