// A queue of outputs that one thread fills and another drains in batches
// (an engine thread pushing a request's tokens, a gRPC handler streaming
// them). Thread-safe.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pdserve {

template <typename T>
class OutputQueue {
 public:
  // Moves everything queued into `out`; waits up to `timeout` when empty.
  // Returns false if nothing arrived.
  bool Next(absl::Duration timeout, std::vector<T>* out) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (queue_.empty()) return false;
    while (!queue_.empty()) {
      out->push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    return true;
  }

  void Push(T output) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(output));
  }

 private:
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve
