// The interface between the runtime (scheduler, sampler, server) and a model on a backend.
//
// One forward call runs one engine step: a batch of sequences, each contributing a chunk of
// new tokens (a prefill chunk, or one decode token, or k+1 tokens to verify). Caches live
// in the model (on its device): a paged KV pool for the full-attention layers, addressed
// through each sequence's block table, and fixed GDN state slots (conv + recurrent state)
// for the linear-attention layers. The runtime owns the allocation of blocks and slots.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "io/qwen35_config.h"

namespace moeserve::model {

// Sizes the runtime needs to budget memory.
struct CacheGeometry {
  int kv_block_size = 16;          // tokens per KV block
  size_t bytes_per_kv_block = 0;   // one block over all full-attention layers (K and V)
  size_t bytes_per_state_slot = 0; // one sequence's GDN conv + recurrent state, all linear layers
};

// One sequence's part of a step.
struct SeqStep {
  std::span<const int32_t> tokens;     // new tokens, appended at positions start_pos...
  int64_t start_pos = 0;               // tokens already in this sequence's caches
  std::span<const int32_t> kv_blocks;  // block table covering [0, start_pos + tokens.size())
  int32_t state_slot = -1;             // GDN state slot; holds the state after start_pos tokens
  bool all_logits = false;             // logits for every new token, else only for the last
};

struct StepOutput {
  int64_t vocab = 0;
  std::vector<float> logits;           // [rows, vocab] fp32
  std::vector<int64_t> first_row;      // per SeqStep: index of its first row in `logits`
  std::vector<int64_t> num_rows;       // per SeqStep: tokens.size() if all_logits else 1
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const io::Qwen35Config& config() const = 0;
  virtual CacheGeometry cache_geometry() const = 0;
  // (Re)allocates the KV pool and the state slots; previous contents are lost.
  virtual void allocate_caches(int num_kv_blocks, int num_state_slots) = 0;
  // Zeroes a state slot: a new sequence starts from it.
  virtual void reset_state(int32_t slot) = 0;
  // Copies one slot's state into another (prefix cache, speculative rollback).
  virtual void copy_state(int32_t src, int32_t dst) = 0;
  // Runs one step. Updates the KV blocks and state slots of every sequence in the batch.
  virtual void forward(std::span<const SeqStep> batch, StepOutput& out) = 0;
};

}  // namespace moeserve::model
