#include "runtime/cache_plan.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "runtime/block_manager.h"

namespace moeserve::runtime {

CachePlan plan_cache(const model::CacheGeometry& geometry, const EngineConfig& config) {
  MOESERVE_CHECK(geometry.kv_block_size > 0, "the model reports a KV block size of {}", geometry.kv_block_size);
  MOESERVE_CHECK(config.kv_block_size == 0 || config.kv_block_size == geometry.kv_block_size,
                 "kv_block_size {} does not match the model's KV block size {}", config.kv_block_size,
                 geometry.kv_block_size);
  MOESERVE_CHECK(config.max_model_len > 0, "max_model_len must be positive, got {}", config.max_model_len);
  MOESERVE_CHECK(config.max_num_seqs > 0, "max_num_seqs must be positive, got {}", config.max_num_seqs);
  MOESERVE_CHECK(config.num_kv_blocks_override >= 0 && config.num_state_slots_override >= 0,
                 "block and slot overrides must not be negative");

  CachePlan plan;
  plan.kv_block_size = geometry.kv_block_size;
  const int blocks_per_seq = BlockManager::blocks_for_tokens(config.max_model_len, geometry.kv_block_size);
  const auto block_bytes = uint64_t(geometry.bytes_per_kv_block);
  const auto slot_bytes = uint64_t(geometry.bytes_per_state_slot);
  const uint64_t one_seq_bytes = uint64_t(blocks_per_seq) * block_bytes + slot_bytes;

  if (config.num_kv_blocks_override > 0 || config.num_state_slots_override > 0) {
    MOESERVE_CHECK(config.num_kv_blocks_override > 0 && config.num_state_slots_override > 0,
                   "num_kv_blocks_override and num_state_slots_override go together (got {} and {})",
                   config.num_kv_blocks_override, config.num_state_slots_override);
    MOESERVE_CHECK(config.num_kv_blocks_override >= blocks_per_seq,
                   "{} KV blocks of {} tokens cannot hold one sequence of max_model_len={} (needs {} blocks)",
                   config.num_kv_blocks_override, geometry.kv_block_size, config.max_model_len, blocks_per_seq);
    plan.num_kv_blocks = config.num_kv_blocks_override;
    plan.num_state_slots = std::min(config.num_state_slots_override, config.max_num_seqs);
  } else {
    MOESERVE_CHECK(config.kv_cache_bytes > 0, "no memory for the KV cache (kv_cache_bytes is 0)");
    const uint64_t budget = config.kv_cache_bytes;
    MOESERVE_CHECK(budget >= one_seq_bytes,
                   "the cache budget of {} bytes cannot hold one sequence of max_model_len={}: that needs {} "
                   "bytes ({} KV blocks of {} bytes + one state slot of {} bytes); lower max_model_len or give "
                   "the cache more memory",
                   budget, config.max_model_len, one_seq_bytes, blocks_per_seq, block_bytes, slot_bytes);
    const uint64_t after_one_seq = budget - uint64_t(blocks_per_seq) * block_bytes;
    uint64_t slots = uint64_t(config.max_num_seqs);
    if (slot_bytes > 0) slots = std::min<uint64_t>(slots, after_one_seq / slot_bytes);
    const uint64_t for_blocks = budget - slots * slot_bytes;
    uint64_t blocks = block_bytes > 0 ? for_blocks / block_bytes : uint64_t(blocks_per_seq) * slots;
    // Block ids are int32; far more than any cache needs.
    blocks = std::min<uint64_t>(blocks, uint64_t(INT32_MAX));
    plan.num_state_slots = int(slots);
    plan.num_kv_blocks = int(blocks);
  }
  plan.bytes = size_t(uint64_t(plan.num_kv_blocks) * block_bytes + uint64_t(plan.num_state_slots) * slot_bytes);
  return plan;
}

}  // namespace moeserve::runtime
