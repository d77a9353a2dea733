#include "model/qwen35_cache.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::model {

GdnLayerStates::GdnLayerStates(const cpu::GdnGeometry& g, int num_slots)
    : conv_size_(size_t(g.conv_state_size())),
      recurrent_size_(size_t(g.recurrent_state_size())),
      conv_(conv_size_ * size_t(num_slots), 0.0f),
      recurrent_(recurrent_size_ * size_t(num_slots), 0.0f) {}

void GdnLayerStates::reset(int32_t slot) {
  std::fill_n(conv(slot), conv_size_, 0.0f);
  std::fill_n(recurrent(slot), recurrent_size_, 0.0f);
}

void GdnLayerStates::copy(int32_t src, int32_t dst) {
  if (src == dst) return;
  std::copy_n(conv(src), conv_size_, conv(dst));
  std::copy_n(recurrent(src), recurrent_size_, recurrent(dst));
}

void ModelCaches::allocate(const cpu::KvGeometry& kv, int kv_layers, int num_kv_blocks, const cpu::GdnGeometry& gdn,
                           int gdn_layers, int num_state_slots) {
  MOESERVE_CHECK(num_kv_blocks >= 0 && num_state_slots >= 0,
                 "cache sizes must not be negative (KV blocks {}, state slots {})", num_kv_blocks, num_state_slots);
  kv_.clear();
  gdn_.clear();
  for (int i = 0; i < kv_layers; ++i) kv_.emplace_back(kv, num_kv_blocks);
  for (int i = 0; i < gdn_layers; ++i) gdn_.emplace_back(gdn, num_state_slots);
  num_kv_blocks_ = num_kv_blocks;
  num_state_slots_ = num_state_slots;
}

cpu::PagedKvCache& ModelCaches::kv(int index) {
  MOESERVE_CHECK(index >= 0 && size_t(index) < kv_.size(),
                 "KV cache of attention layer {} is not allocated (call allocate_caches first)", index);
  return kv_[size_t(index)];
}

GdnLayerStates& ModelCaches::gdn(int index) {
  MOESERVE_CHECK(index >= 0 && size_t(index) < gdn_.size(),
                 "GDN states of linear layer {} are not allocated (call allocate_caches first)", index);
  return gdn_[size_t(index)];
}

void ModelCaches::check_slot(int32_t slot) const {
  MOESERVE_CHECK(slot >= 0 && slot < num_state_slots_, "GDN state slot {} is outside [0, {})", slot,
                 num_state_slots_);
}

void ModelCaches::reset_state(int32_t slot) {
  check_slot(slot);
  for (auto& g : gdn_) g.reset(slot);
}

void ModelCaches::copy_state(int32_t src, int32_t dst) {
  check_slot(src);
  check_slot(dst);
  for (auto& g : gdn_) g.copy(src, dst);
}

}  // namespace moeserve::model
