// Logging for host code (spdlog). Do not include from .cu files: fmt 9 does not compile
// under nvcc -std=c++20.
#pragma once
#include <spdlog/spdlog.h>

namespace moeserve::log {
using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::warn;
// Sets the level from a name: trace, debug, info, warn, error.
void set_level(const std::string& level);
}  // namespace moeserve::log
