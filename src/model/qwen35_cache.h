// The per-sequence caches of the CPU model: a paged K/V pool per full-attention layer and
// fixed GDN state slots (conv + recurrent state) per linear-attention layer, all fp32.
// Blocks and slots are allocated and assigned by the runtime (causal_lm.h).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/gated_delta_net.h"
#include "backend/cpu/paged_kv_cache.h"

namespace moeserve::model {

// The state slots of one linear-attention layer.
class GdnLayerStates {
 public:
  GdnLayerStates() = default;
  GdnLayerStates(const cpu::GdnGeometry& geometry, int num_slots);

  // conv state [conv_dim][K−1] and recurrent state [nv][dk][dv] of a slot.
  float* conv(int32_t slot) { return conv_.data() + size_t(slot) * conv_size_; }
  float* recurrent(int32_t slot) { return recurrent_.data() + size_t(slot) * recurrent_size_; }
  void reset(int32_t slot);
  void copy(int32_t src, int32_t dst);

 private:
  size_t conv_size_ = 0, recurrent_size_ = 0;
  std::vector<float> conv_, recurrent_;
};

class ModelCaches {
 public:
  // kv_layers: number of full-attention layers with a KV pool (the MTP layer counts);
  // gdn_layers: number of linear-attention layers.
  void allocate(const cpu::KvGeometry& kv, int kv_layers, int num_kv_blocks, const cpu::GdnGeometry& gdn,
                int gdn_layers, int num_state_slots);

  int num_kv_blocks() const { return num_kv_blocks_; }
  int num_state_slots() const { return num_state_slots_; }
  // The KV pool / GDN slots of the index-th full / linear layer; throws a moeserve::Error
  // when the caches were not allocated.
  cpu::PagedKvCache& kv(int index);
  GdnLayerStates& gdn(int index);

  // Throws a moeserve::Error unless 0 <= slot < num_state_slots.
  void check_slot(int32_t slot) const;
  void reset_state(int32_t slot);
  void copy_state(int32_t src, int32_t dst);

 private:
  int num_kv_blocks_ = 0, num_state_slots_ = 0;
  std::vector<cpu::PagedKvCache> kv_;
  std::vector<GdnLayerStates> gdn_;
};

}  // namespace moeserve::model
