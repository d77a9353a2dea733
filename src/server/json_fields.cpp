#include "server/json_fields.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "server/api_error.h"

namespace moeserve::server {

namespace {
std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{}", v);
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected,
                             const nlohmann::json& got) {
  throw_bad_request(fmt::format("`{}` must be {}, got {}", param, expected, json_type_name(got)),
                    param);
}
}  // namespace

bool NumberRange::contains(double v) const {
  if (std::isnan(v)) return false;
  if (min_exclusive ? !(v > min) : !(v >= min)) return false;
  if (max_exclusive ? !(v < max) : !(v <= max)) return false;
  return true;
}

std::string NumberRange::describe() const {
  const bool no_min = std::isinf(min) && min < 0;
  const bool no_max = std::isinf(max) && max > 0;
  if (no_min && no_max) return "a finite number";
  if (no_max) return fmt::format("{} {}", min_exclusive ? ">" : ">=", format_number(min));
  if (no_min) return fmt::format("{} {}", max_exclusive ? "<" : "<=", format_number(max));
  return fmt::format("in {}{}, {}{}", min_exclusive ? "(" : "[", format_number(min),
                     format_number(max), max_exclusive ? ")" : "]");
}

std::string json_type_name(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "integer";
    case nlohmann::json::value_t::number_float: return "number";
    case nlohmann::json::value_t::string: return "string";
    case nlohmann::json::value_t::array: return "array";
    case nlohmann::json::value_t::object: return "object";
    default: return "binary";
  }
}

JsonFields::JsonFields(const nlohmann::json& object, std::string path)
    : object_(object), path_(std::move(path)) {
  if (!object_.is_object())
    throw_bad_request(fmt::format("{} must be a JSON object, got {}",
                                  path_.empty() ? "the request body" : path_.substr(0, path_.size() - 1),
                                  json_type_name(object_)),
                      path_.empty() ? std::nullopt : std::optional(path_.substr(0, path_.size() - 1)));
}

std::string JsonFields::param(const std::string& name) const { return path_ + name; }

const nlohmann::json* JsonFields::get(const std::string& name) const {
  auto it = object_.find(name);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonFields::has(const std::string& name) const { return get(name) != nullptr; }

std::optional<std::string> JsonFields::string(const std::string& name) const {
  const auto* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(param(name), "a string", *v);
  return v->get<std::string>();
}

std::string JsonFields::required_string(const std::string& name) const {
  auto s = string(name);
  if (!s) throw_bad_request(fmt::format("`{}` is required", param(name)), param(name));
  return *s;
}

std::optional<bool> JsonFields::boolean(const std::string& name) const {
  const auto* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(param(name), "a boolean", *v);
  return v->get<bool>();
}

std::optional<int64_t> JsonFields::integer(const std::string& name, int64_t min,
                                           int64_t max) const {
  const auto* v = get(name);
  if (!v) return std::nullopt;
  int64_t value;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
      throw_bad_request(fmt::format("`{}` is too large", param(name)), param(name));
    value = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.007199254740992e15)
      throw_bad_request(fmt::format("`{}` must be an integer, got {}", param(name), d), param(name));
    value = int64_t(d);
  } else {
    wrong_type(param(name), "an integer", *v);
  }
  if (value < min || value > max) {
    std::string bound;
    if (min != INT64_MIN && max != INT64_MAX) bound = fmt::format("in [{}, {}]", min, max);
    else if (min != INT64_MIN) bound = fmt::format(">= {}", min);
    else bound = fmt::format("<= {}", max);
    throw_bad_request(fmt::format("`{}` must be {}, got {}", param(name), bound, value), param(name));
  }
  return value;
}

std::optional<double> JsonFields::number(const std::string& name,
                                         std::optional<NumberRange> range) const {
  const auto* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(param(name), "a number", *v);
  const double value = v->get<double>();
  const NumberRange r = range.value_or(NumberRange{-std::numeric_limits<double>::infinity(),
                                                   std::numeric_limits<double>::infinity()});
  if (!std::isfinite(value) || !r.contains(value))
    throw_bad_request(fmt::format("`{}` must be {}, got {}", param(name), r.describe(),
                                  format_number(value)),
                      param(name));
  return value;
}

const nlohmann::json* JsonFields::object(const std::string& name) const {
  const auto* v = get(name);
  if (v && !v->is_object()) wrong_type(param(name), "an object", *v);
  return v;
}

const nlohmann::json* JsonFields::array(const std::string& name) const {
  const auto* v = get(name);
  if (v && !v->is_array()) wrong_type(param(name), "an array", *v);
  return v;
}

std::optional<std::vector<std::string>> JsonFields::string_or_strings(
    const std::string& name) const {
  const auto* v = get(name);
  if (!v) return std::nullopt;
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      const auto& e = (*v)[i];
      if (!e.is_string()) wrong_type(fmt::format("{}[{}]", param(name), i), "a string", e);
      out.push_back(e.get<std::string>());
    }
  } else {
    wrong_type(param(name), "a string or an array of strings", *v);
  }
  return out;
}

std::vector<int32_t> read_token_ids(const nlohmann::json& value, const std::string& param) {
  if (!value.is_array()) wrong_type(param, "an array of token ids", value);
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const auto& e = value[i];
    if (!e.is_number_integer())
      wrong_type(fmt::format("{}[{}]", param, i), "an integer token id", e);
    if (e.is_number_unsigned() ? e.get<uint64_t>() > uint64_t(INT32_MAX)
                               : (e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX))
      throw_bad_request(fmt::format("`{}[{}]` is not a valid token id: {}", param, i, e.dump()),
                        param);
    ids.push_back(int32_t(e.get<int64_t>()));
  }
  return ids;
}

}  // namespace moeserve::server
