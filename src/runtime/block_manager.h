// The paged KV cache's allocator: a fixed pool of blocks (kv_block_size tokens each, over all
// full-attention layers), handed out by id with reference counts so that a block can be
// shared between sequences (fork, for prefix caching) and returns to the free list when its
// last holder frees it. Only ids are managed here; the bytes live in the model.
#pragma once
#include <cstdint>
#include <vector>

namespace moeserve::runtime {

class BlockManager {
 public:
  explicit BlockManager(int num_blocks);

  int num_total() const { return int(ref_counts_.size()); }
  int num_free() const { return int(free_.size()); }
  int num_used() const { return num_total() - num_free(); }
  bool can_allocate(int n) const { return n <= num_free(); }

  // A free block with reference count 1. Throws std::logic_error when none is free (callers
  // check can_allocate first).
  int32_t allocate();
  // Appends n new blocks to `table`; all or nothing.
  void allocate(int n, std::vector<int32_t>& table);
  // One more holder of an allocated block (copy-on-write sharing).
  void fork(int32_t block);
  // One holder fewer; at zero the block is free again.
  void free(int32_t block);
  // Frees every block of a table (last first, so they are reused first) and clears it.
  void free_all(std::vector<int32_t>& table);

  int ref_count(int32_t block) const;

  // Blocks needed to hold `tokens` tokens.
  static int blocks_for_tokens(int64_t tokens, int block_size) {
    return int((tokens + block_size - 1) / block_size);
  }

  // Throws std::logic_error unless every block is either free (count 0, listed once) or
  // held (count > 0, not listed). Tests call it; it is O(blocks).
  void check_consistency() const;

 private:
  void check_id(int32_t block, const char* what) const;

  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
};

}  // namespace moeserve::runtime
