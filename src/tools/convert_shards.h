// How a converted checkpoint is cut into files, as Hugging Face save_pretrained does it:
// plan items in order, a new shard whenever the next item would push the current one past the
// maximum (an item larger than the maximum gets a shard of its own; a quantised module's tensors
// stay together). One shard is written as model.safetensors without an index; more are
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json:
//   {"metadata": {"total_size": <tensor bytes>}, "weight_map": {tensor: file, ...}}
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/convert_plan.h"

namespace moeserve::tools {

// "200KB", "5GB", "1.5GB", "100MiB", "4096" (bytes), like HF's max_shard_size: decimal units
// KB/MB/GB/TB (1000^n), binary KiB/MiB/GiB/TiB (1024^n), B or no unit for bytes; case-insensitive.
// Throws on anything else, or a size of 0.
uint64_t parse_size(const std::string& text);

struct Shard {
  std::string file_name;
  std::vector<size_t> items;  // indices into ConvertPlan::items, in order
  uint64_t tensor_bytes = 0;
};

std::vector<Shard> assign_shards(const ConvertPlan& plan, uint64_t max_shard_bytes);

// model.safetensors.index.json for a multi-shard layout.
nlohmann::ordered_json shard_index_json(const ConvertPlan& plan, const std::vector<Shard>& shards);

}  // namespace moeserve::tools
