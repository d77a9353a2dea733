// The blocks of a Qwen3.5 decoder layer on the CPU, over all rows of one engine step
// (../shared/spec/qwen35_arch.md sections 2.2-2.7). Rows are the step's new tokens in batch
// order; each sequence owns a contiguous run of rows, its positions, block table and state
// slot. Shared by the main model and the MTP block.
#pragma once
#include <cstdint>
#include <span>

#include "backend/cpu/paged_kv_cache.h"
#include "backend/cpu/rope.h"
#include "core/thread_pool.h"
#include "io/qwen35_config.h"
#include "model/qwen35_cache.h"
#include "model/qwen35_weights.h"

namespace moeserve::model {

// One sequence's rows in a step.
struct SeqRows {
  int64_t first_row = 0;
  int64_t num_tokens = 0;
  int64_t start_pos = 0;  // position of the first row
  std::span<const int32_t> kv_blocks;
  int32_t state_slot = -1;
};

struct StepContext {
  ThreadPool& pool;
  const io::Qwen35Config& config;
  const cpu::RotaryEmbedding& rope;
  std::span<const SeqRows> seqs;
  std::span<const int64_t> positions;  // per row
  int64_t rows = 0;                    // Σ num_tokens
};

// The caches one layer reads and updates: a KV pool (full attention) or GDN slots (linear).
struct LayerCaches {
  cpu::PagedKvCache* kv = nullptr;
  GdnLayerStates* gdn = nullptr;
};

// Gated full attention (section 2.3): x [rows, H] -> out [rows, H].
void full_attention_block(const StepContext& ctx, const AttentionWeights& w, cpu::PagedKvCache& kv,
                          const float* x, float* out);

// Gated DeltaNet (section 2.5): x [rows, H] -> out [rows, H].
void gated_delta_net_block(const StepContext& ctx, const GdnWeights& w, GdnLayerStates& states, const float* x,
                           float* out);

// Sparse MoE with the shared expert (section 2.7): x [rows, H] -> out [rows, H].
void moe_block(const StepContext& ctx, const MoeWeights& w, const float* x, float* out);

// Pre-norm residual layer (section 2.2): h += mixer(RMSNorm_in(h)); h += MoE(RMSNorm_post(h)).
void decoder_layer(const StepContext& ctx, const DecoderLayerWeights& w, LayerCaches caches, float* h);

}  // namespace moeserve::model
