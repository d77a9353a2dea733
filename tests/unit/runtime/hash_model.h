// A deterministic stand-in for a real CausalLM, for testing the engine.
//
// Its logits for the token at position p are a pure function of the token history [0, p]:
// a hash chain over the tokens seeds one pseudo-random value per vocabulary entry. The
// same function, applied to a plain token list (reference_logits), is the reference the
// engine's outputs are checked against.
//
// It keeps real caches the way a model must: every token it consumes is written into the
// KV block the block table names for its position, and each state slot carries the running
// hash and the number of tokens it has absorbed. Before each step it re-reads the history
// from the KV blocks and checks it against the slot, so a wrong block table, a block shared
// by two sequences, a slot not reset, or a start_pos that disagrees with the slot all fail
// loudly (forward throws std::logic_error, which the tests see as an aborted request).
#pragma once
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/causal_lm.h"
#include "runtime/rng.h"

namespace moeserve::runtime::testing {

inline uint64_t hash_step(uint64_t h, int32_t token) {
  uint64_t s = h ^ (uint64_t(uint32_t(token)) * 0x9E3779B97F4A7C15ull);
  return splitmix64(s);
}
inline constexpr uint64_t kHashSeed = 0x5EEDF00Dull;

// Logit of token v after a history with hash h: uniform in [-4, 4).
inline float hashed_logit(uint64_t h, int64_t v) {
  uint64_t s = h + uint64_t(v) * 0xD1B54A32D192ED03ull;
  return float(double(splitmix64(s) >> 11) * 0x1.0p-53 * 8.0 - 4.0);
}

inline std::vector<float> logits_for_hash(uint64_t h, int64_t vocab) {
  std::vector<float> out(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) out[size_t(v)] = hashed_logit(h, v);
  return out;
}

// The logits the model gives after `history` (the prediction for the next token).
inline std::vector<float> reference_logits(std::span<const int32_t> history, int64_t vocab) {
  uint64_t h = kHashSeed;
  for (int32_t t : history) h = hash_step(h, t);
  return logits_for_hash(h, vocab);
}

class HashModel : public model::CausalLM {
 public:
  struct Options {
    int64_t vocab = 64;
    int block_size = 4;
    std::vector<int64_t> eos = {0};
    size_t bytes_per_kv_block = 1000;
    size_t bytes_per_state_slot = 5000;
    int64_t max_position_embeddings = 4096;
    // Failure injection, keyed on a sequence's first token so that generated tokens never
    // trigger it: forward throws for a sequence starting with poison_token, and returns all-NaN
    // rows for one starting with nan_token.
    int32_t poison_token = -1;
    int32_t nan_token = -1;
    std::chrono::microseconds forward_delay{0};  // makes steps slow enough to race against
  };

  explicit HashModel(Options options) : options_(std::move(options)) {
    config_.model_type = "hash_test_model";
    config_.vocab_size = options_.vocab;
    config_.eos_token_ids = options_.eos;
    config_.max_position_embeddings = options_.max_position_embeddings;
  }

  const io::Qwen35Config& config() const override { return config_; }

  model::CacheGeometry cache_geometry() const override {
    model::CacheGeometry g;
    g.kv_block_size = options_.block_size;
    g.bytes_per_kv_block = options_.bytes_per_kv_block;
    g.bytes_per_state_slot = options_.bytes_per_state_slot;
    return g;
  }

  void allocate_caches(int num_kv_blocks, int num_state_slots) override {
    std::lock_guard lock(mutex_);
    kv_.assign(size_t(num_kv_blocks) * size_t(options_.block_size), -1);
    slots_.assign(size_t(num_state_slots), Slot{});
    num_kv_blocks_ = num_kv_blocks;
  }

  void reset_state(int32_t slot) override {
    std::lock_guard lock(mutex_);
    check_slot(slot);
    slots_[size_t(slot)] = Slot{kHashSeed, 0, true};
    ++resets_;
  }

  void copy_state(int32_t src, int32_t dst) override {
    std::lock_guard lock(mutex_);
    check_slot(src);
    check_slot(dst);
    slots_[size_t(dst)] = slots_[size_t(src)];
  }

  void forward(std::span<const model::SeqStep> batch, model::StepOutput& out) override {
    {
      std::unique_lock gate(gate_mutex_);
      gate_cv_.wait(gate, [&] { return !held_; });
    }
    if (options_.forward_delay.count() > 0) std::this_thread::sleep_for(options_.forward_delay);
    std::lock_guard lock(mutex_);
    ++num_forwards_;
    StepRecord record;
    for (const auto& s : batch) {
      record.tokens += int64_t(s.tokens.size());
      record.slots.push_back(s.state_slot);
      record.start_pos.push_back(s.start_pos);
      record.num_tokens.push_back(int64_t(s.tokens.size()));
      record.prompt_len.push_back(s.prompt_len);
    }
    record.seqs = int(batch.size());
    steps_.push_back(std::move(record));

    out.vocab = options_.vocab;
    out.logits.clear();
    out.first_row.assign(batch.size(), 0);
    out.num_rows.assign(batch.size(), 0);
    // Check everything first, so that a throwing step leaves no half-written state behind.
    for (const auto& s : batch) validate(s);
    for (size_t i = 0; i < batch.size(); ++i) {
      const model::SeqStep& s = batch[i];
      Slot& slot = slots_[size_t(s.state_slot)];
      out.first_row[i] = int64_t(out.logits.size()) / options_.vocab;
      out.num_rows[i] = s.all_logits ? int64_t(s.tokens.size()) : 1;
      for (size_t j = 0; j < s.tokens.size(); ++j) {
        const int64_t pos = s.start_pos + int64_t(j);
        kv_at(s.kv_blocks, pos) = s.tokens[j];
        slot.hash = hash_step(slot.hash, s.tokens[j]);
        ++slot.length;
        if (s.all_logits || j + 1 == s.tokens.size()) {
          if (kv_at(s.kv_blocks, 0) == options_.nan_token) {
            out.logits.insert(out.logits.end(), size_t(options_.vocab), std::numeric_limits<float>::quiet_NaN());
          } else {
            auto row = logits_for_hash(slot.hash, options_.vocab);
            out.logits.insert(out.logits.end(), row.begin(), row.end());
          }
        }
      }
    }
  }

  // hold() makes forward wait until release(): requests submitted meanwhile pile up, so a
  // test can decide what the next steps see.
  void hold() {
    std::lock_guard lock(gate_mutex_);
    held_ = true;
  }
  void release() {
    {
      std::lock_guard lock(gate_mutex_);
      held_ = false;
    }
    gate_cv_.notify_all();
  }

  // What each forward held.
  struct StepRecord {
    int seqs = 0;
    int64_t tokens = 0;
    std::vector<int32_t> slots;
    std::vector<int64_t> start_pos, num_tokens;
    std::vector<int64_t> prompt_len;  // SeqStep::prompt_len of each sequence
  };
  std::vector<StepRecord> steps() const {
    std::lock_guard lock(mutex_);
    return steps_;
  }
  int64_t num_forwards() const {
    std::lock_guard lock(mutex_);
    return num_forwards_;
  }
  int64_t num_resets() const {
    std::lock_guard lock(mutex_);
    return resets_;
  }
  int num_kv_blocks() const {
    std::lock_guard lock(mutex_);
    return num_kv_blocks_;
  }
  int num_state_slots() const {
    std::lock_guard lock(mutex_);
    return int(slots_.size());
  }

 private:
  struct Slot {
    uint64_t hash = kHashSeed;
    int64_t length = 0;
    bool valid = false;  // reset since allocation
  };

  void check_slot(int32_t slot) const {
    if (slot < 0 || size_t(slot) >= slots_.size())
      throw std::logic_error("HashModel: state slot " + std::to_string(slot) + " out of range");
  }

  int32_t& kv_at(std::span<const int32_t> table, int64_t pos) {
    const int32_t block = table[size_t(pos / options_.block_size)];
    return kv_[size_t(block) * size_t(options_.block_size) + size_t(pos % options_.block_size)];
  }

  void validate(const model::SeqStep& s) {
    check_slot(s.state_slot);
    const Slot& slot = slots_[size_t(s.state_slot)];
    if (!slot.valid) throw std::logic_error("HashModel: state slot used before reset_state");
    if (slot.length != s.start_pos)
      throw std::logic_error("HashModel: slot holds " + std::to_string(slot.length) + " tokens, step starts at " +
                             std::to_string(s.start_pos));
    if (s.tokens.empty()) throw std::logic_error("HashModel: empty step");
    const int64_t end = s.start_pos + int64_t(s.tokens.size());
    if (int64_t(s.kv_blocks.size()) * options_.block_size < end)
      throw std::logic_error("HashModel: block table too short");
    for (int32_t b : s.kv_blocks)
      if (b < 0 || b >= num_kv_blocks_) throw std::logic_error("HashModel: block id out of range");
    for (int32_t t : s.tokens)
      if (t < 0 || t >= options_.vocab) throw std::logic_error("HashModel: token out of range");
    const int32_t first = s.start_pos == 0 ? s.tokens[0] : kv_at(s.kv_blocks, 0);
    if (first == options_.poison_token) throw std::runtime_error("HashModel: poison token");
    // The KV blocks must still hold this sequence's history, and agree with the slot.
    uint64_t h = kHashSeed;
    for (int64_t p = 0; p < s.start_pos; ++p) h = hash_step(h, kv_at(s.kv_blocks, p));
    if (h != slot.hash) throw std::logic_error("HashModel: KV blocks disagree with the state slot");
  }

  Options options_;
  io::Qwen35Config config_;
  mutable std::mutex mutex_;
  std::mutex gate_mutex_;
  std::condition_variable gate_cv_;
  bool held_ = false;
  std::vector<int32_t> kv_;
  std::vector<Slot> slots_;
  int num_kv_blocks_ = 0;
  int64_t num_forwards_ = 0;
  int64_t resets_ = 0;
  std::vector<StepRecord> steps_;
};

}  // namespace moeserve::runtime::testing
