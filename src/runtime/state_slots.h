// The GDN state cache's allocator: a fixed number of slots (one sequence's conv + recurrent
// state for every linear-attention layer each); every running sequence holds exactly one.
// Only ids are managed here; the state lives in the model (CausalLM::reset_state zeroes one).
#pragma once
#include <cstdint>
#include <vector>

namespace moeserve::runtime {

class StateSlotPool {
 public:
  explicit StateSlotPool(int num_slots);

  int num_total() const { return int(in_use_.size()); }
  int num_free() const { return int(free_.size()); }
  bool in_use(int32_t slot) const;

  // A free slot; throws std::logic_error when none is.
  int32_t acquire();
  // Returns a held slot; throws std::logic_error on a slot not held.
  void release(int32_t slot);

 private:
  std::vector<char> in_use_;
  std::vector<int32_t> free_;  // a stack, lowest ids on top initially
};

}  // namespace moeserve::runtime
