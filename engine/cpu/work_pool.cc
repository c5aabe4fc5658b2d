// WorkPool; see work_pool.h for the contract.
#include "engine/cpu/work_pool.h"

#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pdserve::engine::cpu {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kIndexMask = 0xFFFFFFFFu;
// Index field of a generation being set up: no index can be claimed.
constexpr uint64_t kClosed = kIndexMask;

// True on a thread while it runs an index of some pool's loop (a worker) or
// drives one (a caller): a nested ParallelFor runs inline.
thread_local bool in_loop = false;

uint32_t Generation(uint64_t claim) { return static_cast<uint32_t>(claim >> 32); }

void Pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

}  // namespace

WorkPool::WorkPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { Worker(); });
}

WorkPool::~WorkPool() {
  stop_.store(true);
  wake_.fetch_add(1);
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void WorkPool::RunLoop(uint32_t gen) {
  uint64_t claim = claim_.load(std::memory_order_acquire);
  // The claim word is read before fn_ and n_: a generation seen open here was
  // published after its fn_ and n_ (release/acquire). If the caller has
  // since closed it to set up the next loop, fn_ and n_ may already hold
  // that loop's values, but then claim_ has changed and the compare-and-swap
  // below fails, so a stale pair is never used.
  if (Generation(claim) != gen || (claim & kIndexMask) == kClosed) return;
  const absl::FunctionRef<void(int64_t)>* fn = fn_.load(std::memory_order_acquire);
  const int64_t n = n_.load(std::memory_order_acquire);
  while (Generation(claim) == gen && static_cast<int64_t>(claim & kIndexMask) < n) {
    // On success claim_ still held (gen, index), so the loop of `gen` was
    // open and fn and n belong to it.
    if (claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      (*fn)(static_cast<int64_t>(claim & kIndexMask));
      done_.fetch_add(1, std::memory_order_release);
      claim = claim_.load(std::memory_order_acquire);
    }
  }
}

void WorkPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
  if (n <= 0) return;
  // Nested calls (from fn) and one-thread pools run inline: the pool's
  // threads are busy with the outer loop, and a nested loop must not wait
  // for them.
  if (workers_.empty() || n == 1 || in_loop) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (n >= static_cast<int64_t>(kClosed)) std::abort();  // beyond the index field
  absl::MutexLock lock(&caller_mu_);
  in_loop = true;
  // Every index of the previous loop is claimed and done. The new generation
  // is published closed first, so that a worker late from the previous loop
  // cannot pair the old generation with the new fn_ and n_; then fn_, n_ and
  // done_ are set, then the generation is opened.
  const uint32_t gen = Generation(claim_.load(std::memory_order_relaxed)) + 1;
  claim_.store((uint64_t{gen} << 32) | kClosed, std::memory_order_seq_cst);
  fn_.store(&fn, std::memory_order_release);
  n_.store(n, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(uint64_t{gen} << 32, std::memory_order_seq_cst);
  wake_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_.notify_all();
  RunLoop(gen);
  // What is left is in the hands of workers: spin, and yield the core now
  // and then in case a worker holding an index waits for it.
  for (int spins = 0; done_.load(std::memory_order_acquire) < n; ++spins) {
    if (spins % 1024 == 1023) {
      std::this_thread::yield();
    } else {
      Pause();
    }
  }
  in_loop = false;
}

void WorkPool::Worker() {
  uint32_t seen = 0;  // the last generation this worker ran
  while (true) {
    // Poll for a new generation for up to kSpin, then sleep on wake_.
    const Clock::time_point spin_until = Clock::now() + kSpin;
    uint64_t claim = claim_.load(std::memory_order_acquire);
    // A generation still being set up (closed) counts as not yet there.
    for (int spins = 0; (Generation(claim) == seen || (claim & kIndexMask) == kClosed) &&
                        !stop_.load(std::memory_order_relaxed);
         ++spins) {
      if (spins % 64 == 63 && Clock::now() > spin_until) {
        const uint32_t wake = wake_.load(std::memory_order_seq_cst);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        // Re-checked after announcing the sleep: ParallelFor publishes the
        // generation before it reads sleepers_, so one of the two sees the
        // other.
        if (Generation(claim_.load(std::memory_order_seq_cst)) == seen &&
            !stop_.load(std::memory_order_seq_cst)) {
          wake_.wait(wake, std::memory_order_seq_cst);
        }
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        spins = 0;
      } else {
        Pause();
      }
      claim = claim_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = Generation(claim);
    in_loop = true;
    RunLoop(seen);
    in_loop = false;
  }
}

}  // namespace pdserve::engine::cpu
