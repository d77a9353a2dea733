// Errors that reach an HTTP client. Every failure a request can cause is an ApiError with
// the HTTP status and the OpenAI error object that vLLM sends:
//   {"error": {"message": "...", "type": "BadRequestError", "param": "top_p", "code": 400}}
// (`code` is the HTTP status, `param` names the offending request field or is null).
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moeserve::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::optional<std::string> param = std::nullopt);

  int status() const { return status_; }
  const std::optional<std::string>& param() const { return param_; }
  // The OpenAI error type for the status ("BadRequestError", "NotFoundError", ...).
  std::string type() const;
  // The whole response body: {"error": {...}}.
  nlohmann::json to_json() const;

 private:
  int status_;
  std::optional<std::string> param_;
};

// The OpenAI/vLLM error type name for an HTTP status.
std::string error_type_for_status(int status);

// Shorthands for the statuses handlers raise.
[[noreturn]] void throw_bad_request(const std::string& message,
                                    std::optional<std::string> param = std::nullopt);
[[noreturn]] void throw_not_found(const std::string& message,
                                  std::optional<std::string> param = std::nullopt);

}  // namespace moeserve::server
