#include "core/log.h"

#include "core/error.h"

namespace moeserve::log {
void set_level(const std::string& level) {
  auto l = spdlog::level::from_str(level);
  MOESERVE_CHECK(l != spdlog::level::off || level == "off", "unknown log level '{}'", level);
  spdlog::set_level(l);
}
}  // namespace moeserve::log
