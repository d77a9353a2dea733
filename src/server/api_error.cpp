#include "server/api_error.h"

namespace moeserve::server {

ApiError::ApiError(int status, std::string message, std::optional<std::string> param)
    : Error(std::move(message)), status_(status), param_(std::move(param)) {}

std::string error_type_for_status(int status) {
  switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 403: return "PermissionDeniedError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 408: return "RequestTimeoutError";
    case 413: return "RequestEntityTooLargeError";
    case 422: return "UnprocessableEntityError";
    case 429: return "RateLimitError";
    case 501: return "NotImplementedError";
    case 503: return "ServiceUnavailableError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

std::string ApiError::type() const { return error_type_for_status(status_); }

nlohmann::json ApiError::to_json() const {
  nlohmann::json error = {{"message", what()}, {"type", type()}, {"code", status_}};
  error["param"] = param_ ? nlohmann::json(*param_) : nlohmann::json(nullptr);
  return {{"error", std::move(error)}};
}

void throw_bad_request(const std::string& message, std::optional<std::string> param) {
  throw ApiError(400, message, std::move(param));
}

void throw_not_found(const std::string& message, std::optional<std::string> param) {
  throw ApiError(404, message, std::move(param));
}

}  // namespace moeserve::server
