#include "server/auth.h"

#include <cctype>
#include <cstdint>

namespace moeserve::server {

namespace {
bool constant_time_equal(std::string_view a, std::string_view b) {
  // Length is not secret-dependent enough to matter, but still walk all of `a`.
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= unsigned(uint8_t(a[i])) ^ unsigned(uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}
}  // namespace

bool ApiKeyAuth::route_requires_key(std::string_view path) {
  return path.substr(0, 4) == "/v1/" || path == "/v1" || path == "/tokenize" ||
         path == "/detokenize";
}

bool ApiKeyAuth::accepts(std::string_view header) const {
  if (keys_.empty()) return true;
  // "Bearer <key>", scheme case-insensitive (RFC 7235 section 2.1).
  constexpr std::string_view scheme = "bearer ";
  if (header.size() < scheme.size()) return false;
  for (size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(uint8_t(header[i])) != scheme[i]) return false;
  std::string_view token = header.substr(scheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  bool ok = false;
  for (const auto& key : keys_) ok |= constant_time_equal(key, token);
  return ok;
}

}  // namespace moeserve::server
