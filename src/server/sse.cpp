#include "server/sse.h"

namespace moeserve::server {

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& chunk) {
  std::string out = "data: ";
  out += dump_json(chunk);
  out += "\n\n";
  return out;
}

}  // namespace moeserve::server
