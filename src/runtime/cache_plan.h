// How the cache memory budget splits into KV blocks and GDN state slots.
#pragma once
#include <cstddef>

#include "model/causal_lm.h"
#include "runtime/engine_config.h"

namespace moeserve::runtime {

struct CachePlan {
  int kv_block_size = 0;
  int num_kv_blocks = 0;
  int num_state_slots = 0;
  size_t bytes = 0;  // what the plan uses: blocks * bytes_per_kv_block + slots * bytes_per_state_slot
};

// Blocks for one max_model_len sequence are reserved first; then slots for up to
// max_num_seqs sequences (fewer when the budget is short); blocks get the rest. The
// *_override fields replace the split. Throws moeserve::Error, naming the numbers, when the
// configuration is invalid or one max_model_len sequence does not fit.
CachePlan plan_cache(const model::CacheGeometry& geometry, const EngineConfig& config);

}  // namespace moeserve::runtime
