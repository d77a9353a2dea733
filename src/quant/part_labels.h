// Names for the stored tensors of one weight, so that a format's validation can say exactly
// which file and tensor is wrong ("checkpoint /m: tensor layers.0.mlp.experts.3.up_proj.scales
// (model-00002-of-00004.safetensors: model.layers.0.mlp.experts.3.up_proj.scales)").
// The checkpoint loader fills it from the checkpoint; weights built in memory (tests, the
// converter) get the generic "weight 'NAME' part 'ROLE'".
#pragma once
#include <map>
#include <string>

namespace moeserve::quant {

struct PartLabels {
  std::string weight;                          // the weight as a whole: "checkpoint DIR: module M"
  std::map<std::string, std::string> tensors;  // role ("qweight", "scales", ...) -> its description

  // Labels for a weight built in memory.
  static PartLabels in_memory(const std::string& name) {
    std::string weight = "weight '";
    weight.append(name).append("'");
    return PartLabels{std::move(weight), {}};
  }

  std::string of(const std::string& role) const {
    auto it = tensors.find(role);
    if (it != tensors.end()) return it->second;
    std::string generic = weight;
    generic.append(" part '").append(role).append("'");
    return generic;
  }
};

}  // namespace moeserve::quant
