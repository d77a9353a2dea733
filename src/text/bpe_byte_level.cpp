#include "text/bpe_byte_level.h"

#include <array>

#include "text/unicode.h"

namespace moeserve::text {
namespace {

struct ByteLevelTables {
  std::array<char32_t, 256> byte_to_char{};
  std::array<std::string, 256> byte_to_utf8;
  // Every mapped code point is below U+0144 (0x100 + 68): index the reverse table directly.
  std::array<int16_t, 0x200> char_to_byte{};

  ByteLevelTables() {
    char_to_byte.fill(-1);
    char32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
      byte_to_char[b] = cp;
      append_utf8(byte_to_utf8[b], cp);
      char_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables instance;
  return instance;
}

}  // namespace

char32_t byte_level_char(uint8_t byte) { return tables().byte_to_char[byte]; }

std::string_view byte_level_char_utf8(uint8_t byte) { return tables().byte_to_utf8[byte]; }

std::optional<uint8_t> byte_level_byte(char32_t cp) {
  if (cp >= tables().char_to_byte.size()) return std::nullopt;
  const int16_t b = tables().char_to_byte[cp];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

bool byte_level_to_bytes(std::string_view token, std::string& out) {
  const size_t start = out.size();
  size_t pos = 0;
  while (pos < token.size()) {
    const auto byte = byte_level_byte(next_code_point(token, pos));
    if (!byte) {
      out.resize(start);
      return false;
    }
    out.push_back(static_cast<char>(*byte));
  }
  return true;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_level_char_utf8(b);
  return out;
}

}  // namespace moeserve::text
