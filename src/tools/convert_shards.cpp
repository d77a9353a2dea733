#include "tools/convert_shards.h"

#include <cctype>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve::tools {

uint64_t parse_size(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) ++pos;
  const std::string number = text.substr(0, pos);
  std::string unit;
  for (char c : text.substr(pos)) unit += char(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},         {"B", 1},           {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12},    {"KIB", 1024.0},    {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  const auto it = kUnits.find(unit);
  const bool number_ok = !number.empty() && number != "." && number.find('.') == number.rfind('.');
  if (!number_ok || it == kUnits.end())
    fail("size '{}' is not a number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '5GB'", text);
  const double bytes = std::floor(std::stod(number) * it->second);
  if (!(bytes >= 1) || bytes > 1.8e19) fail("size '{}' is out of range (at least 1 byte)", text);
  return uint64_t(bytes);
}

std::vector<Shard> assign_shards(const ConvertPlan& plan, uint64_t max_shard_bytes) {
  std::vector<Shard> shards;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    uint64_t bytes = 0;
    for (const OutputTensor& o : plan.items[i].outputs) bytes += o.nbytes();
    if (shards.empty() || (!shards.back().items.empty() && shards.back().tensor_bytes + bytes > max_shard_bytes))
      shards.emplace_back();
    shards.back().items.push_back(i);
    shards.back().tensor_bytes += bytes;
  }
  if (shards.empty()) shards.emplace_back();
  if (shards.size() == 1) {
    shards[0].file_name = "model.safetensors";
  } else {
    for (size_t s = 0; s < shards.size(); ++s)
      shards[s].file_name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
  }
  return shards;
}

nlohmann::ordered_json shard_index_json(const ConvertPlan& plan, const std::vector<Shard>& shards) {
  std::map<std::string, std::string> weight_map;  // sorted by tensor name, as transformers writes it
  uint64_t total = 0;
  for (const Shard& shard : shards)
    for (size_t i : shard.items)
      for (const OutputTensor& o : plan.items[i].outputs) {
        weight_map[o.name] = shard.file_name;
        total += o.nbytes();
      }
  nlohmann::ordered_json j;
  j["metadata"] = {{"total_size", total}};
  j["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [name, file] : weight_map) j["weight_map"][name] = file;
  return j;
}

}  // namespace moeserve::tools
