#include "io/json_fields.h"

#include "core/error.h"

namespace moeserve::io {

JsonFields::JsonFields(const nlohmann::json& object, std::string source, std::string prefix)
    : object_(&object), source_(std::move(source)), prefix_(std::move(prefix)) {
  if (!object.is_object())
    fail("{}: {} must be a JSON object, found {}", source_,
         prefix_.empty() ? std::string("the top level") : prefix_.substr(0, prefix_.size() - 1),
         object.type_name());
}

const nlohmann::json* JsonFields::find(const std::string& key) const {
  auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

std::string JsonFields::where(const std::string& key) const { return source_ + ": " + prefix_ + key; }

void JsonFields::wrong_type(const std::string& key, const char* expected) const {
  fail("{} must be {}, found {} {}", where(key), expected, find(key)->type_name(),
       find(key)->dump().substr(0, 80));
}

std::optional<int64_t> JsonFields::integer(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > uint64_t(INT64_MAX)) wrong_type(key, "a 64-bit integer");
    return int64_t(v->get<uint64_t>());
  }
  if (!v->is_number_integer()) wrong_type(key, "an integer");
  return v->get<int64_t>();
}

std::optional<double> JsonFields::number(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number");
  return v->get<double>();
}

std::optional<bool> JsonFields::boolean(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "true or false");
  return v->get<bool>();
}

std::optional<std::string> JsonFields::string(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string");
  return v->get<std::string>();
}

std::optional<std::vector<int64_t>> JsonFields::integer_list(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_array()) wrong_type(key, "a list of integers");
  std::vector<int64_t> out;
  for (const auto& e : *v) {
    if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > uint64_t(INT64_MAX)))
      wrong_type(key, "a list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::optional<std::vector<std::string>> JsonFields::string_list(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_array()) wrong_type(key, "a list of strings");
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string()) wrong_type(key, "a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::optional<JsonFields> JsonFields::object(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_object()) wrong_type(key, "an object");
  return JsonFields(*v, source_, prefix_ + key + ".");
}

}  // namespace moeserve::io
