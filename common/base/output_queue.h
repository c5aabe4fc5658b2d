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
  // Moves everything queued into `out`; waits up to `timeout` when empty
  // (not once closed). Returns false if nothing arrived.
  bool Next(absl::Duration timeout, std::vector<T>* out) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || closed_; };
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

  // The reader needs nothing more (its request was cancelled): wakes a Next
  // that waits, and later ones return without waiting.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pdserve
