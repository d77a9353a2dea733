#include "runtime/state_slots.h"

#include <stdexcept>
#include <string>

namespace moeserve::runtime {

StateSlotPool::StateSlotPool(int num_slots) {
  if (num_slots < 0) throw std::invalid_argument("StateSlotPool: negative slot count");
  in_use_.assign(size_t(num_slots), 0);
  for (int s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

bool StateSlotPool::in_use(int32_t slot) const {
  return slot >= 0 && size_t(slot) < in_use_.size() && in_use_[size_t(slot)];
}

int32_t StateSlotPool::acquire() {
  if (free_.empty()) throw std::logic_error("StateSlotPool::acquire: no free state slot");
  const int32_t slot = free_.back();
  free_.pop_back();
  in_use_[size_t(slot)] = 1;
  return slot;
}

void StateSlotPool::release(int32_t slot) {
  if (!in_use(slot)) throw std::logic_error("StateSlotPool::release: slot " + std::to_string(slot) + " is not held");
  in_use_[size_t(slot)] = 0;
  free_.push_back(slot);
}

}  // namespace moeserve::runtime
