// UTF-8 validation for request bodies: a body that is not valid UTF-8 is rejected with a
// 400 naming the byte offset, before JSON parsing (RFC 8259 section 8.1 requires UTF-8).
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace moeserve::server {

// Returns the offset of the first byte that is not part of a well-formed UTF-8 sequence
// (Unicode 15, table 3-7: no overlongs, no surrogates, nothing above U+10FFFF), or nullopt.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// Code points in well-formed UTF-8 (OpenAI's text offsets count characters, not bytes).
size_t utf8_length(std::string_view text);

}  // namespace moeserve::server
