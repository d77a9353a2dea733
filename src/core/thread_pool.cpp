#include "core/thread_pool.h"

#include <algorithm>

namespace moeserve {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t parts = std::min<int64_t>(size(), (n + grain - 1) / grain);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  ranges_.assign(size_t(size()), {0, 0});
  for (int64_t p = 0; p < parts; ++p) ranges_[size_t(p)] = {n * p / parts, n * (p + 1) / parts};
  job_ = &fn;
  error_ = nullptr;
  pending_ = int(workers_.size());
  ++generation_;
  lock.unlock();
  wake_.notify_all();

  // The calling thread takes range 0.
  std::exception_ptr mine;
  try {
    fn(ranges_[0].first, ranges_[0].second);
  } catch (...) {
    mine = std::current_exception();
  }
  lock.lock();
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  auto err = mine ? mine : error_;
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto range = ranges_[size_t(index)];
    const auto* job = job_;
    lock.unlock();
    std::exception_ptr err;
    if (range.second > range.first) {
      try {
        (*job)(range.first, range.second);
      } catch (...) {
        err = std::current_exception();
      }
    }
    lock.lock();
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace moeserve
