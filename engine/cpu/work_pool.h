// WorkPool: the threads of a decode step's short parallel loops (the batch-1
// GEMV's rows, attention's heads).
//
// A decode step runs some fifty loops of 10 us to 2 ms each. Forking an
// OpenMP team per loop costs a futex wake-up per loop under
// OMP_WAIT_POLICY=passive (the setting a shared machine needs), which on the
// 2-vCPU machine of docs/performance.md cost as much as the second thread
// saved; spinning OpenMP workers (the default policy) collapse instead when
// the cores are oversubscribed. Here workers spin on the next loop for a
// bounded time (kSpin) and then sleep, and every index is claimed from a
// shared counter by whichever thread is running: the caller takes part, so a
// descheduled worker delays a loop by at most the one index it holds.
//
// Thread safety: ParallelFor may be called from any thread; concurrent calls
// from different threads run one after the other (caller_mu_). A call made
// while running any pool's `fn` (nested) runs inline on that thread. `fn` runs on the
// caller and on the workers concurrently and must not throw: an exception
// on a worker ends the process, and on the caller it would leave the
// workers running a loop whose `fn` is gone.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace pdserve::engine::cpu {

class WorkPool {
 public:
  // How long an idle worker polls for the next loop before it sleeps.
  static constexpr std::chrono::microseconds kSpin{200};

  // `num_threads` >= 1 threads in all: the caller of ParallelFor and
  // num_threads - 1 workers started here.
  explicit WorkPool(int num_threads);
  ~WorkPool();  // wakes and joins the workers
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) once for every i in [0, n) on the caller and the workers;
  // returns when all have returned. Indices are claimed one at a time in
  // increasing order. n < 2^32 - 1. A nested call runs its indices in order
  // on the thread that makes it.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn);

 private:
  // The loop being run. Written by the caller only while claim_ holds the
  // new generation closed; read by workers only after they saw it open
  // (atomics: a late worker may read them while the next loop is being set
  // up, and then its claim fails).
  std::atomic<const absl::FunctionRef<void(int64_t)>*> fn_{nullptr};
  std::atomic<int64_t> n_{0};
  // Generation of the current loop (high 32 bits) and its next unclaimed
  // index (low 32 bits): a claim is a compare-and-swap of both, so a worker
  // still holding an older generation can never take an index of this one.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};   // indices of the current loop finished
  std::atomic<uint32_t> wake_{0};  // bumped per loop; sleeping workers wait on it
  std::atomic<int> sleepers_{0};   // workers blocked in wake_.wait
  std::atomic<bool> stop_{false};
  absl::Mutex caller_mu_;             // held by the thread running a loop
  std::vector<std::thread> workers_;  // last: they use everything above

  // Claims and runs indices of generation `gen` until none are left.
  void RunLoop(uint32_t gen);
  void Worker();
};

}  // namespace pdserve::engine::cpu
