// API keys (--api-key, like vLLM): requests to /v1/* must carry
// `Authorization: Bearer <key>`; /health, /metrics and /version stay open so that probes
// and scrapers work without the secret.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::server {

class ApiKeyAuth {
 public:
  explicit ApiKeyAuth(std::vector<std::string> keys) : keys_(std::move(keys)) {}

  bool enabled() const { return !keys_.empty(); }
  // Whether a route needs a key at all.
  static bool route_requires_key(std::string_view path);
  // Whether the Authorization header value carries one of the keys. The comparison takes
  // the same time wherever the first difference is (no timing oracle for the key).
  bool accepts(std::string_view authorization_header) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace moeserve::server
