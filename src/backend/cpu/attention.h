// Causal softmax attention of a chunk of queries over a paged K/V cache
// (../shared/spec/qwen35_arch.md section 2.3 step 5), fp32, with grouped-query heads:
// query head i reads K/V head i / (nq / nkv).
#pragma once
#include <cstdint>
#include <span>

#include "backend/cpu/paged_kv_cache.h"
#include "core/thread_pool.h"

namespace moeserve::cpu {

// One sequence's queries in a step. The cache must already hold K/V for positions
// [0, start_pos + num_tokens) of this sequence (write the chunk's own K/V first).
struct AttentionChunk {
  const float* q = nullptr;  // [num_tokens][nq][head_dim], normalised and rotated
  float* out = nullptr;      // [num_tokens][nq][head_dim]
  int64_t num_tokens = 0;
  int64_t start_pos = 0;     // position of the first query
  std::span<const int32_t> block_table;
};

// out_i = softmax(q_i · K_jᵀ · scale) V_j over positions ≤ the query's own. Threaded over
// (query, head); each output sums over positions in increasing order.
void paged_attention(ThreadPool& pool, const PagedKvCache& cache, int64_t num_q_heads, float scale,
                     std::span<const AttentionChunk> chunks);

}  // namespace moeserve::cpu
