// Conversion of nlohmann JSON (json or ordered_json) into template values: objects
// become dicts in the JSON object's iteration order (insertion order for
// nlohmann::ordered_json, sorted keys for nlohmann::json), integers stay ints, floats
// floats.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja/error.h"
#include "text/jinja/value.h"

namespace moeserve::text::jinja {

template <typename BasicJson>
Value from_json(const BasicJson& j, int depth = 0) {
  if (depth > kMaxNestingDepth)
    throw TemplateError(TemplateError::Kind::kRuntime, "template variables are nested too deeply");
  using Type = typename BasicJson::value_t;
  switch (j.type()) {
    case Type::null: return Value::none();
    case Type::boolean: return Value::boolean(j.template get<bool>());
    case Type::number_integer: return Value::integer(j.template get<int64_t>());
    case Type::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw TemplateError(TemplateError::Kind::kRuntime,
                            "integer " + std::to_string(u) + " in the template variables does not fit in 64 bits");
      return Value::integer(static_cast<int64_t>(u));
    }
    case Type::number_float: return Value::floating(j.template get<double>());
    case Type::string: return Value::string(j.template get<std::string>());
    case Type::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item, depth + 1));
      return Value::sequence(std::move(items));
    }
    case Type::object: {
      auto dict = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) dict->set(Value::string(it.key()), from_json(it.value(), depth + 1));
      return Value::dict(std::move(dict));
    }
    default:
      throw TemplateError(TemplateError::Kind::kRuntime, "template variables must be plain JSON (no binary values)");
  }
}

}  // namespace moeserve::text::jinja
