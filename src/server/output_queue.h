// The hand-off between the engine thread and the HTTP worker that serves one request: the
// engine's output callback pushes (cheap: a lock, a move, a notify), the worker waits with a
// timeout so that it can check in between whether its client is still connected.
#pragma once
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "runtime/request_output.h"

namespace moeserve::server {

class OutputQueue {
 public:
  // Engine thread.
  void push(const runtime::RequestOutput& output);
  // Worker: everything queued, waiting up to `timeout` for the first output.
  std::vector<runtime::RequestOutput> pop_all(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<runtime::RequestOutput> items_;
};

}  // namespace moeserve::server
