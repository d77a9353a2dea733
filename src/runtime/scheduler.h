// Continuous batching: picks what every engine step computes.
//
// Queues: `running` sequences hold a state slot and KV blocks; `waiting` ones hold nothing.
// Both are ordered by arrival, and every running sequence arrived before every waiting one
// (admission is strictly FIFO and the preemption victim is always the newest running
// sequence, which goes back to the front of the waiting queue). So the oldest request
// always makes progress and none starves.
//
// One step, under max_num_batched_tokens tokens and max_num_seqs sequences:
//   1. decode first: one token for every running sequence that has a single token left to
//      compute (its last sampled token);
//   2. prefill chunks for running sequences that are partway through their prompt;
//   3. KV blocks for those chunks, oldest sequence first; when the pool runs dry the newest
//      running sequence is preempted (blocks and slot freed) until the chunk fits;
//   4. if nothing was preempted, admission: the front of the waiting queue gets a state slot
//      and a first prefill chunk while the token budget, a slot and blocks (keeping the
//      admission watermark free) allow; the first request that does not fit stops admission.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "runtime/block_manager.h"
#include "runtime/sequence.h"
#include "runtime/state_slots.h"

namespace moeserve::runtime {

struct SchedulerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;  // >= max_num_seqs, so every decode fits in a step
  int kv_block_size = 16;
  double kv_admission_watermark = 0.01;
  // A prefill chunk that stops short of the sequence's end ends at a multiple of this many
  // positions (absolute, from the sequence start), so that a model whose prompt kernels work in
  // position-aligned blocks (the DeltaNet chunked form: 64) computes the same bits however the
  // prompt is cut into steps. A sequence whose next boundary is out of this step's remaining
  // budget waits for a later step, unless the budget could never reach one
  // (max_num_batched_tokens - max_num_seqs < alignment): then it is cut where the budget ends.
  int prefill_alignment = 1;
};

// One sequence's part of a step: tokens [start_pos, start_pos + num_tokens).
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start_pos = 0;
  int num_tokens = 0;
  bool samples = false;     // the chunk reaches the end of seq->tokens: sample the next token
  bool all_logits = false;  // rows for every token (prompt logprobs)
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;   // oldest sequence first
  std::vector<int32_t> slots_to_reset;  // slots of sequences admitted this step
  std::vector<Sequence*> preempted;     // moved back to waiting this step
  int num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockManager& blocks, StateSlotPool& slots);

  // Queues a new sequence at the back of the waiting queue.
  void add(Sequence* seq);
  // Takes a sequence out of whichever queue holds it and frees its blocks and slot.
  void remove(Sequence* seq);
  // Plans one step and reserves its blocks and slots. The caller runs it and then calls
  // complete() (or remove() for sequences that failed).
  SchedulerOutput schedule();
  // Marks the chunks' tokens as computed.
  void complete(const SchedulerOutput& output);
  // Forgets every sequence without touching the pools (the engine rebuilds them after an
  // internal error).
  void clear() {
    running_.clear();
    waiting_.clear();
  }

  const std::deque<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  int64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(Sequence* seq, SchedulerOutput& out);
  int blocks_missing(const Sequence& seq, int num_tokens) const;
  // Tokens of seq's next chunk within budget (0: wait for a step with room up to an aligned cut).
  int prefill_take(const Sequence& seq, int budget) const;
  ScheduledChunk make_chunk(Sequence* seq, int num_tokens) const;

  SchedulerConfig config_;
  BlockManager& blocks_;
  StateSlotPool& slots_;
  std::deque<Sequence*> running_;
  std::deque<Sequence*> waiting_;
  int64_t num_preemptions_ = 0;
};

}  // namespace moeserve::runtime
