// The paged K/V store of one full-attention layer (fp32).
//
// K and V are each laid out [num_blocks][num_kv_heads][block_size][head_dim]; a sequence's
// position p lives in block block_table[p / block_size], slot p % block_size. Blocks are
// owned and handed out by the runtime; this class only stores and addresses them. The pool
// is zeroed and resident from construction on (ZeroedHostBuffer).
#pragma once
#include <cstdint>
#include <span>

#include "core/zeroed_host_buffer.h"

namespace moeserve::cpu {

struct KvGeometry {
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;
};

class PagedKvCache {
 public:
  PagedKvCache() = default;
  PagedKvCache(const KvGeometry& geometry, int64_t num_blocks);

  const KvGeometry& geometry() const { return geometry_; }
  int64_t num_blocks() const { return num_blocks_; }
  // Bytes of one block, K and V together.
  static size_t bytes_per_block(const KvGeometry& g) {
    return size_t(2 * g.num_kv_heads * g.block_size * g.head_dim) * sizeof(float);
  }

  float* key(int32_t block, int64_t head, int64_t slot) { return floats(keys_) + offset(block, head, slot); }
  float* value(int32_t block, int64_t head, int64_t slot) { return floats(values_) + offset(block, head, slot); }
  const float* key(int32_t block, int64_t head, int64_t slot) const {
    return floats(keys_) + offset(block, head, slot);
  }
  const float* value(int32_t block, int64_t head, int64_t slot) const {
    return floats(values_) + offset(block, head, slot);
  }

  // Checks that `block_table` covers positions [0, end_pos) with valid block ids; throws a
  // moeserve::Error naming the problem otherwise.
  void check_block_table(std::span<const int32_t> block_table, int64_t end_pos) const;

  // Stores k, v [num_tokens][num_kv_heads][head_dim] at positions start_pos...
  void write(std::span<const int32_t> block_table, int64_t start_pos, int64_t num_tokens, const float* k,
             const float* v);

 private:
  size_t offset(int32_t block, int64_t head, int64_t slot) const {
    return size_t(((int64_t(block) * geometry_.num_kv_heads + head) * geometry_.block_size + slot) *
                  geometry_.head_dim);
  }

  static float* floats(ZeroedHostBuffer& b) { return reinterpret_cast<float*>(b.data()); }
  static const float* floats(const ZeroedHostBuffer& b) { return reinterpret_cast<const float*>(b.data()); }

  KvGeometry geometry_;
  int64_t num_blocks_ = 0;
  ZeroedHostBuffer keys_, values_;  // fp32, page-aligned
};

}  // namespace moeserve::cpu
