// Error type used across moeserve. Every failure that a user can cause (a bad file, a bad
// flag, a bad request) is reported as a moeserve::Error with a message that names what is
// wrong and where; never as a crash.
#pragma once
#include <stdexcept>
#include <string>

#ifndef __CUDACC__  // fmt 9 does not compile under nvcc -std=c++20; .cu files use Error directly
#include <fmt/format.h>
#endif

namespace moeserve {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

#ifndef __CUDACC__
// Throws moeserve::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

#endif
}  // namespace moeserve

#ifndef __CUDACC__
// Checks an invariant that user input can break; throws moeserve::Error otherwise.
#define MOESERVE_CHECK(cond, ...)                 \
  do {                                            \
    if (!(cond)) ::moeserve::fail(__VA_ARGS__);   \
  } while (0)
#endif
