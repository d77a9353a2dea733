// Typed, validated access to fields of a JSON object for config files: every error names the
// file and the field path ("config.json: text_config.hidden_size must be an integer, found
// string"). A null value counts as absent, as transformers treats None.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::io {

class JsonFields {
 public:
  // `prefix` is the path of `object` inside the file ("" for the root, "text_config." ...).
  JsonFields(const nlohmann::json& object, std::string source, std::string prefix = "");

  // The field, or nullptr when absent or null.
  const nlohmann::json* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // "file: prefix.key", for messages.
  std::string where(const std::string& key) const;

  std::optional<int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;  // integer or float
  std::optional<bool> boolean(const std::string& key) const;
  std::optional<std::string> string(const std::string& key) const;
  std::optional<std::vector<int64_t>> integer_list(const std::string& key) const;
  std::optional<std::vector<std::string>> string_list(const std::string& key) const;
  // A nested object, or nullopt when absent; an error when present but not an object.
  std::optional<JsonFields> object(const std::string& key) const;

  const nlohmann::json& json() const { return *object_; }
  const std::string& source() const { return source_; }

 private:
  [[noreturn]] void wrong_type(const std::string& key, const char* expected) const;

  const nlohmann::json* object_;
  std::string source_;
  std::string prefix_;
};

}  // namespace moeserve::io
