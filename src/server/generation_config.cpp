#include "server/generation_config.h"

#include <fstream>
#include <limits>

#include "core/error.h"

namespace moeserve::server {

using nlohmann::json;

namespace {
std::optional<double> number(const json& j, const char* key, const std::string& source, double lo, double hi,
                             bool lo_exclusive = false) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  MOESERVE_CHECK(it->is_number(), "{}: `{}` must be a number, got {}", source, key, it->dump());
  const double v = it->get<double>();
  MOESERVE_CHECK((lo_exclusive ? v > lo : v >= lo) && v <= hi, "{}: `{}` = {} is out of range", source, key, v);
  return v;
}
}  // namespace

GenerationConfig parse_generation_config(const json& j, const std::string& source) {
  MOESERVE_CHECK(j.is_object(), "{}: not a JSON object", source);
  GenerationConfig g;
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    const json ids = it->is_array() ? *it : json::array({*it});
    for (const auto& v : ids) {
      MOESERVE_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                     "{}: eos_token_id must hold token ids, got {}", source, it->dump());
      g.eos_token_ids.push_back(int32_t(v.get<int64_t>()));
    }
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  g.defaults.temperature = number(j, "temperature", source, 0, kInf);
  g.defaults.top_p = number(j, "top_p", source, 0, 1, /*lo_exclusive=*/true);
  g.defaults.min_p = number(j, "min_p", source, 0, 1);
  g.defaults.repetition_penalty = number(j, "repetition_penalty", source, 0, kInf, true);
  if (auto k = number(j, "top_k", source, -1, INT32_MAX)) g.defaults.top_k = int(*k);
  if (auto n = number(j, "max_new_tokens", source, 1, INT32_MAX)) g.defaults.max_tokens = int(*n);
  return g;
}

GenerationConfig load_generation_config(const std::filesystem::path& dir) {
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return {};
  std::ifstream in(path);
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  MOESERVE_CHECK(!j.is_discarded(), "{}: not valid JSON", path.string());
  return parse_generation_config(j, path.string());
}

}  // namespace moeserve::server
