#include "quant/linear_loader.h"

namespace moeserve::quant {

QuantWeight load_linear(const io::Checkpoint& ckpt, const std::string& module, int64_t out_features,
                        int64_t in_features, const io::Qwen35Config& config) {
  (void)config;  // quantised formats read their group/block sizes from it
  return dense_weight(ckpt.get_float(module + ".weight", {out_features, in_features}), module);
}

}  // namespace moeserve::quant
