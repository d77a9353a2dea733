// A fixed pool of worker threads with a deterministic parallel_for.
//
// Determinism contract: parallel_for splits [0, n) into contiguous ranges and calls
// fn(begin, end) once per range. Callers make each output element depend on one range
// only and reduce inside a range in index order, so results do not depend on the thread
// count (the CPU reference model relies on this; tests check it).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve {

class ThreadPool {
 public:
  // threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }  // workers + the calling thread

  // Runs fn(begin, end) over [0, n) split into at most size() ranges of at least `grain`
  // items; blocks until all are done. Exceptions from fn are rethrown in the caller.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace moeserve
