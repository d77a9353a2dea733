#include "backend/cpu/paged_kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::cpu {

PagedKvCache::PagedKvCache(const KvGeometry& geometry, int64_t num_blocks)
    : geometry_(geometry), num_blocks_(num_blocks) {
  MOESERVE_CHECK(geometry.num_kv_heads > 0 && geometry.head_dim > 0 && geometry.block_size > 0,
                 "KV cache geometry must be positive (heads {}, head_dim {}, block_size {})",
                 geometry.num_kv_heads, geometry.head_dim, geometry.block_size);
  MOESERVE_CHECK(num_blocks >= 0, "negative number of KV blocks: {}", num_blocks);
  const size_t bytes =
      size_t(num_blocks * geometry.num_kv_heads * geometry.block_size * geometry.head_dim) * sizeof(float);
  keys_ = ZeroedHostBuffer(bytes);
  values_ = ZeroedHostBuffer(bytes);
}

void PagedKvCache::check_block_table(std::span<const int32_t> block_table, int64_t end_pos) const {
  const int64_t needed = (end_pos + geometry_.block_size - 1) / geometry_.block_size;
  MOESERVE_CHECK(int64_t(block_table.size()) >= needed,
                 "block table has {} blocks but {} positions need {} blocks of {}", block_table.size(), end_pos,
                 needed, geometry_.block_size);
  for (int64_t i = 0; i < needed; ++i) {
    const int32_t b = block_table[size_t(i)];
    MOESERVE_CHECK(b >= 0 && b < num_blocks_, "block table entry {} is {}, outside the pool of {} KV blocks", i,
                   b, num_blocks_);
  }
}

void PagedKvCache::write(std::span<const int32_t> block_table, int64_t start_pos, int64_t num_tokens,
                         const float* k, const float* v) {
  check_block_table(block_table, start_pos + num_tokens);
  const int64_t nkv = geometry_.num_kv_heads, hd = geometry_.head_dim, bs = geometry_.block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t pos = start_pos + t;
    const int32_t block = block_table[size_t(pos / bs)];
    for (int64_t h = 0; h < nkv; ++h) {
      const float* src_k = k + (t * nkv + h) * hd;
      const float* src_v = v + (t * nkv + h) * hd;
      std::copy(src_k, src_k + hd, key(block, h, pos % bs));
      std::copy(src_v, src_v + hd, value(block, h, pos % bs));
    }
  }
}

}  // namespace moeserve::cpu
