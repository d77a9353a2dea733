#include "runtime/scheduler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

namespace moeserve::runtime {

Scheduler::Scheduler(SchedulerConfig config, BlockManager& blocks, StateSlotPool& slots)
    : config_(config), blocks_(blocks), slots_(slots) {
  if (config_.max_num_seqs <= 0 || config_.max_num_batched_tokens < config_.max_num_seqs || config_.kv_block_size <= 0)
    throw std::invalid_argument("Scheduler: invalid configuration");
}

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::Waiting;
  waiting_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) waiting_.erase(it);
  blocks_.free_all(seq->block_table);
  if (seq->state_slot >= 0) slots_.release(seq->state_slot);
  seq->state_slot = -1;
  seq->status = SeqStatus::Finished;
}

void Scheduler::preempt(Sequence* seq, SchedulerOutput& out) {
  // Only the newest running sequence is ever preempted; it is older than every waiting one.
  if (running_.empty() || running_.back() != seq) throw std::logic_error("Scheduler::preempt: not the newest running sequence");
  running_.pop_back();
  blocks_.free_all(seq->block_table);
  slots_.release(seq->state_slot);
  seq->state_slot = -1;
  seq->num_computed = 0;
  seq->status = SeqStatus::Waiting;
  ++seq->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(seq);
  out.preempted.push_back(seq);
}

int Scheduler::blocks_missing(const Sequence& seq, int num_tokens) const {
  const int needed = BlockManager::blocks_for_tokens(seq.num_computed + num_tokens, config_.kv_block_size);
  return std::max(0, needed - int(seq.block_table.size()));
}

int Scheduler::prefill_take(const Sequence& seq, int budget) const {
  const int64_t left = seq.num_uncomputed();
  const int64_t n = std::min<int64_t>(left, budget);
  const int64_t a = config_.prefill_alignment;
  if (a <= 1 || n == left) return int(n);  // the chunk reaches the end: no cut to align
  const int64_t end = seq.num_computed + n;
  const int64_t aligned_end = end - end % a;
  if (aligned_end > seq.num_computed) return int(aligned_end - seq.num_computed);
  const bool boundary_reachable = int64_t(config_.max_num_batched_tokens) - config_.max_num_seqs >= a;
  return boundary_reachable ? 0 : int(n);
}

ScheduledChunk Scheduler::make_chunk(Sequence* seq, int num_tokens) const {
  ScheduledChunk chunk;
  chunk.seq = seq;
  chunk.start_pos = seq->num_computed;
  chunk.num_tokens = num_tokens;
  chunk.samples = seq->num_computed + num_tokens == int64_t(seq->tokens.size());
  chunk.all_logits = seq->wants_prompt_logprobs() && seq->num_computed < seq->num_prompt_tokens;
  return chunk;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;

  // 1-2. Token counts for running sequences: decodes first, then prefill chunks.
  std::unordered_map<const Sequence*, int> want;
  for (Sequence* seq : running_) {
    if (seq->num_uncomputed() == 1 && budget > 0) {
      want[seq] = 1;
      --budget;
    }
  }
  for (Sequence* seq : running_) {
    if (seq->num_uncomputed() > 1 && budget > 0) {
      const int n = prefill_take(*seq, budget);
      if (n == 0) continue;
      want[seq] = n;
      budget -= n;
    }
  }

  // 3. Blocks, oldest first, preempting the newest when short.
  std::vector<std::pair<Sequence*, int>> planned;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence* seq = running_[i];
    const auto it = want.find(seq);
    if (it == want.end()) continue;
    const int n = it->second;
    int missing = blocks_missing(*seq, n);
    bool self_preempted = false;
    while (!blocks_.can_allocate(missing)) {
      Sequence* victim = running_.back();
      if (auto v = want.find(victim); v != want.end()) {
        budget += v->second;
        want.erase(v);
      }
      preempt(victim, out);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // it was the newest: nothing after it is left
    blocks_.allocate(missing, seq->block_table);
    planned.emplace_back(seq, n);
  }
  for (const auto& [seq, n] : planned) {
    out.chunks.push_back(make_chunk(seq, n));
    out.num_tokens += n;
  }

  // 4. Admission, strictly in arrival order.
  if (out.preempted.empty()) {
    const int watermark = int(std::ceil(config_.kv_admission_watermark * blocks_.num_total()));
    while (!waiting_.empty() && budget > 0 && int(running_.size()) < config_.max_num_seqs && slots_.num_free() > 0) {
      Sequence* seq = waiting_.front();
      const int n = prefill_take(*seq, budget);
      if (n == 0) break;
      const int missing = blocks_missing(*seq, n);
      // With nothing running the watermark would only stall the engine.
      const int keep_free = running_.empty() ? 0 : watermark;
      if (blocks_.num_free() - missing < keep_free || !blocks_.can_allocate(missing)) break;
      waiting_.pop_front();
      seq->state_slot = slots_.acquire();
      seq->status = SeqStatus::Running;
      blocks_.allocate(missing, seq->block_table);
      running_.push_back(seq);
      out.slots_to_reset.push_back(seq->state_slot);
      out.chunks.push_back(make_chunk(seq, n));
      out.num_tokens += n;
      budget -= n;
    }
  }
  return out;
}

void Scheduler::complete(const SchedulerOutput& output) {
  for (const ScheduledChunk& chunk : output.chunks) chunk.seq->num_computed = chunk.start_pos + chunk.num_tokens;
}

}  // namespace moeserve::runtime
