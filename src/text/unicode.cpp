#include "text/unicode.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include <utf8proc.h>

#include "core/error.h"

namespace moeserve::text {
namespace {

constexpr char kReplacementCharacter[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence that `lead` starts (Unicode 15, Table 3-7), or 0 when
// `lead` can start no well-formed sequence (80..C1, F5..FF).
inline size_t well_formed_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

// Whether `byte` may follow the first `index` bytes of a sequence led by `lead` (index >= 1).
// The second byte's range depends on the lead byte; that is what rules out overlong forms,
// surrogates and code points above U+10FFFF.
inline bool continues(unsigned char lead, size_t index, unsigned char byte) {
  if (index == 1) {
    switch (lead) {
      case 0xE0: return byte >= 0xA0 && byte <= 0xBF;
      case 0xED: return byte >= 0x80 && byte <= 0x9F;
      case 0xF0: return byte >= 0x90 && byte <= 0xBF;
      case 0xF4: return byte >= 0x80 && byte <= 0x8F;
      default: break;
    }
  }
  return byte >= 0x80 && byte <= 0xBF;
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs are the common case: test eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char lead = p[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    const size_t len = well_formed_length(lead);
    if (len == 0 || i + len > n) return i;
    for (size_t k = 1; k < len; ++k)
      if (!continues(lead, k, p[i + k])) return i;
    i += len;
  }
  return std::nullopt;
}

void check_utf8(std::string_view bytes, std::string_view what) {
  if (auto bad = find_invalid_utf8(bytes)) {
    fail("invalid UTF-8 in {} at byte offset {} (byte 0x{:02X})", what, *bad,
         static_cast<unsigned>(static_cast<unsigned char>(bytes[*bad])));
  }
}

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const unsigned char lead = p[0];
  if (lead < 0x80) {
    pos += 1;
    return lead;
  }
  if (lead < 0xE0) {
    pos += 2;
    return (char32_t(lead & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (lead < 0xF0) {
    pos += 3;
    return (char32_t(lead & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  pos += 4;
  return (char32_t(lead & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
         (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

char32_t last_code_point(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  return next_code_point(text, pos);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void Utf8LossyDecoder::feed(std::string_view bytes, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (pending_len_ == 0) {
      if (b < 0x80) {
        // Copy the whole ASCII run at once.
        size_t j = i + 1;
        while (j < n && p[j] < 0x80) ++j;
        out.append(reinterpret_cast<const char*>(p + i), j - i);
        i = j;
        continue;
      }
      if (well_formed_length(b) == 0) {
        out += kReplacementCharacter;  // a byte that starts nothing is its own maximal subpart
      } else {
        pending_[pending_len_++] = b;
      }
      ++i;
      continue;
    }
    if (continues(pending_[0], pending_len_, b)) {
      pending_[pending_len_++] = b;
      ++i;
      if (pending_len_ == well_formed_length(pending_[0])) {
        out.append(reinterpret_cast<const char*>(pending_), pending_len_);
        pending_len_ = 0;
      }
      continue;
    }
    // The held-back prefix can no longer complete: it is one maximal subpart. `b` is not
    // consumed; it starts the next sequence.
    out += kReplacementCharacter;
    pending_len_ = 0;
  }
}

void Utf8LossyDecoder::finish(std::string& out) {
  if (pending_len_ > 0) out += kReplacementCharacter;
  pending_len_ = 0;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Utf8LossyDecoder decoder;
  decoder.feed(bytes, out);
  decoder.finish(out);
  return out;
}

std::string normalize_unicode(std::string_view text, NormalForm form) {
  // Fast path: text that is trivially in the requested form. Every code point below U+0300 is
  // NFC_Quick_Check=Yes with canonical combining class 0; such text has lead bytes below 0xCC.
  // For the decomposed and compatibility forms only ASCII is trivially unchanged.
  const unsigned char limit = form == NormalForm::NFC ? 0xCC : 0x80;
  bool unchanged = true;
  for (unsigned char c : text) {
    if (c >= limit) {
      unchanged = false;
      break;
    }
  }
  if (unchanged) return std::string(text);

  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  if (len < 0) fail("Unicode normalization failed: {}", utf8proc_errmsg(len));
  return std::string(reinterpret_cast<const char*>(result), static_cast<size_t>(len));
}

bool is_unicode_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_unicode_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols: circled Latin letters, squared/negative Latin capitals.
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
      (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace moeserve::text
