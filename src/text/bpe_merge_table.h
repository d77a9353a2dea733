// The BPE merge rules as an open-addressing hash table from a pair of symbol ids to the
// merge's rank (its index in tokenizer.json's "merges"; lower merges first) and the id of the
// merged symbol. Looking up a pair is the inner loop of BPE, so the table is flat: one probe
// sequence over two parallel arrays, no per-entry allocation.
#pragma once
#include <cstdint>
#include <vector>

namespace moeserve::text {

class BpeMergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  // Sizes the table for `count` merges (load factor <= 1/2).
  void reserve(size_t count) {
    size_t capacity = 16;
    while (capacity < 2 * count) capacity *= 2;
    keys_.assign(capacity, kEmpty);
    values_.assign(capacity, Merge{0, 0});
    mask_ = capacity - 1;
    size_ = 0;
  }

  // Adds or replaces the merge of (left, right). Like HF tokenizers, a pair listed twice keeps
  // the later entry.
  void insert(int32_t left, int32_t right, Merge merge) {
    if (keys_.empty() || 2 * (size_ + 1) > keys_.size()) grow();
    const uint64_t key = pack(left, right);
    size_t slot = hash(key) & mask_;
    while (keys_[slot] != kEmpty && keys_[slot] != key) slot = (slot + 1) & mask_;
    if (keys_[slot] == kEmpty) ++size_;
    keys_[slot] = key;
    values_[slot] = merge;
  }

  const Merge* find(int32_t left, int32_t right) const {
    if (keys_.empty()) return nullptr;
    const uint64_t key = pack(left, right);
    size_t slot = hash(key) & mask_;
    while (true) {
      const uint64_t k = keys_[slot];
      if (k == key) return &values_[slot];
      if (k == kEmpty) return nullptr;
      slot = (slot + 1) & mask_;
    }
  }

  size_t size() const { return size_; }

 private:
  // Ids are non-negative int32, so no pair packs to all ones.
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  static uint64_t pack(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  static size_t hash(uint64_t key) {
    key ^= key >> 29;
    key *= 0xBF58476D1CE4E5B9ULL;
    key ^= key >> 32;
    return static_cast<size_t>(key);
  }

  void grow() {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<Merge> old_values = std::move(values_);
    reserve(old_keys.empty() ? 8 : old_keys.size());
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] == kEmpty) continue;
      insert(int32_t(old_keys[i] >> 32), int32_t(old_keys[i] & 0xFFFFFFFFu), old_values[i]);
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace moeserve::text
