#include "server/output_queue.h"

namespace moeserve::server {

void OutputQueue::push(const runtime::RequestOutput& output) {
  {
    std::lock_guard lock(mutex_);
    items_.push_back(output);
  }
  ready_.notify_one();
}

std::vector<runtime::RequestOutput> OutputQueue::pop_all(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !items_.empty(); });
  std::vector<runtime::RequestOutput> out;
  out.swap(items_);
  return out;
}

}  // namespace moeserve::server
