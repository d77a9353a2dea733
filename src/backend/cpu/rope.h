// Partial NeoX-style rotary position embedding (../shared/spec/qwen35_arch.md section 2.4).
//
// Only the first rotary_dim values of a head rotate; the rest pass through. With text-only
// inputs the interleaved M-RoPE of Qwen3.5 reduces to this 1-D form (all position rows equal).
#pragma once
#include <cstdint>
#include <vector>

namespace moeserve::cpu {

class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  // inv_freq[j] = theta^(-2j / rotary_dim), j < rotary_dim / 2, computed in fp32 as torch does.
  RotaryEmbedding(int64_t rotary_dim, double theta);

  int64_t rotary_dim() const { return rotary_dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }

  // Rotates head[0, rotary_dim) in place for position pos:
  // with x1 = head[0:d/2], x2 = head[d/2:d], f = pos · inv_freq:
  //   x1' = x1 cos f − x2 sin f,   x2' = x2 cos f + x1 sin f.
  void apply(float* head, int64_t pos) const;

 private:
  int64_t rotary_dim_ = 0;
  std::vector<float> inv_freq_;
};

}  // namespace moeserve::cpu
