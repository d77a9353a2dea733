// Typed, validated access to the fields of a JSON request object. Every accessor throws
// ApiError(400) naming the field (with its path for nested objects, e.g.
// "messages[2].content") when the value has the wrong type or is out of range. A field that
// is absent or JSON null reads as "not given", the way OpenAI clients send unset options.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::server {

// An inclusive/exclusive numeric range for error messages such as "must be in (0, 1]".
struct NumberRange {
  double min;
  double max;
  bool min_exclusive = false;
  bool max_exclusive = false;
  bool contains(double v) const;
  std::string describe() const;  // "[0, 2]", "(0, 1]", ">= 1", ...
};

class JsonFields {
 public:
  // `object` must outlive this reader. `path` prefixes field names in errors.
  explicit JsonFields(const nlohmann::json& object, std::string path = "");

  const nlohmann::json& json() const { return object_; }
  // Present and not null.
  bool has(const std::string& name) const;
  // The raw value (nullptr when absent or null).
  const nlohmann::json* get(const std::string& name) const;
  // Full field name for error messages: path + name.
  std::string param(const std::string& name) const;

  std::optional<std::string> string(const std::string& name) const;
  std::string required_string(const std::string& name) const;
  std::optional<bool> boolean(const std::string& name) const;
  // Integers accept integral floats (2.0), like pydantic's lax mode.
  std::optional<int64_t> integer(const std::string& name, int64_t min = INT64_MIN,
                                 int64_t max = INT64_MAX) const;
  std::optional<double> number(const std::string& name,
                               std::optional<NumberRange> range = std::nullopt) const;
  const nlohmann::json* object(const std::string& name) const;
  const nlohmann::json* array(const std::string& name) const;
  // A string or a list of strings (e.g. `stop`).
  std::optional<std::vector<std::string>> string_or_strings(const std::string& name) const;

 private:
  const nlohmann::json& object_;
  std::string path_;
};

// The JSON type name used in error messages ("string", "integer", "object", ...).
std::string json_type_name(const nlohmann::json& value);

// Reads an integer token id list element-wise with a helpful error.
std::vector<int32_t> read_token_ids(const nlohmann::json& value, const std::string& param);

}  // namespace moeserve::server
