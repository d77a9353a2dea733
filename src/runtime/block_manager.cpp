#include "runtime/block_manager.h"

#include <stdexcept>
#include <string>

namespace moeserve::runtime {

BlockManager::BlockManager(int num_blocks) {
  if (num_blocks < 0) throw std::invalid_argument("BlockManager: negative block count");
  ref_counts_.assign(size_t(num_blocks), 0);
  free_.reserve(size_t(num_blocks));
  // Lowest ids on top of the stack, so a fresh pool hands out 0, 1, 2, ...
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockManager::allocate() {
  if (free_.empty()) throw std::logic_error("BlockManager::allocate: no free KV block");
  const int32_t block = free_.back();
  free_.pop_back();
  ref_counts_[size_t(block)] = 1;
  return block;
}

void BlockManager::allocate(int n, std::vector<int32_t>& table) {
  if (n < 0 || !can_allocate(n)) {
    throw std::logic_error("BlockManager::allocate: " + std::to_string(n) + " blocks asked, " +
                           std::to_string(num_free()) + " free");
  }
  table.reserve(table.size() + size_t(n));
  for (int i = 0; i < n; ++i) table.push_back(allocate());
}

void BlockManager::fork(int32_t block) {
  check_id(block, "fork");
  if (ref_counts_[size_t(block)] == 0) throw std::logic_error("BlockManager::fork: block is free");
  ++ref_counts_[size_t(block)];
}

void BlockManager::free(int32_t block) {
  check_id(block, "free");
  int32_t& count = ref_counts_[size_t(block)];
  if (count == 0) throw std::logic_error("BlockManager::free: block " + std::to_string(block) + " freed twice");
  if (--count == 0) free_.push_back(block);
}

void BlockManager::free_all(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) free(*it);
  table.clear();
}

int BlockManager::ref_count(int32_t block) const {
  check_id(block, "ref_count");
  return ref_counts_[size_t(block)];
}

void BlockManager::check_id(int32_t block, const char* what) const {
  if (block < 0 || size_t(block) >= ref_counts_.size()) {
    throw std::logic_error(std::string("BlockManager::") + what + ": block id " + std::to_string(block) +
                           " outside [0, " + std::to_string(ref_counts_.size()) + ")");
  }
}

void BlockManager::check_consistency() const {
  std::vector<char> listed(ref_counts_.size(), 0);
  for (int32_t block : free_) {
    check_id(block, "check_consistency");
    if (listed[size_t(block)]) throw std::logic_error("BlockManager: block listed free twice");
    if (ref_counts_[size_t(block)] != 0) throw std::logic_error("BlockManager: free block has holders");
    listed[size_t(block)] = 1;
  }
  for (size_t b = 0; b < ref_counts_.size(); ++b) {
    if (ref_counts_[b] < 0) throw std::logic_error("BlockManager: negative reference count");
    if (!listed[b] && ref_counts_[b] == 0) throw std::logic_error("BlockManager: block " + std::to_string(b) + " leaked");
  }
}

}  // namespace moeserve::runtime
