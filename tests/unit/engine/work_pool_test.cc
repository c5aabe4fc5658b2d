// WorkPool: every index runs exactly once per loop, loops follow each other
// without mixing, workers that went to sleep wake for the next loop, and a
// one-thread pool runs everything on the caller.
#include "engine/cpu/work_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace pdserve::engine::cpu {
namespace {

TEST(WorkPoolTest, EveryIndexRunsOnceInManyLoops) {
  WorkPool pool(4);
  ASSERT_EQ(pool.num_threads(), 4);
  for (int loop = 0; loop < 2000; ++loop) {
    const int64_t n = 1 + loop % 37;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.ParallelFor(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "loop " << loop << " index " << i;
    }
  }
}

TEST(WorkPoolTest, WorkersTakePartAndWakeAfterSleeping) {
  WorkPool pool(2);
  for (int round = 0; round < 3; ++round) {
    // Longer than the workers' spin, so they are asleep when the loop comes.
    std::this_thread::sleep_for(WorkPool::kSpin * 5);
    absl::Mutex mu;
    std::set<std::thread::id> ids;
    std::atomic<int> sum{0};
    // Each index waits until another thread has run one too (or 2 s pass), so
    // the loop only finishes early if a worker woke up and took part.
    std::atomic<int> started{0};
    pool.ParallelFor(2, [&](int64_t i) {
      started.fetch_add(1);
      for (int wait = 0; started.load() < 2 && wait < 2000; ++wait) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      {
        absl::MutexLock lock(&mu);
        ids.insert(std::this_thread::get_id());
      }
      sum.fetch_add(static_cast<int>(i) + 1);
    });
    EXPECT_EQ(sum.load(), 3);
    EXPECT_EQ(ids.size(), 2u) << "round " << round;
    EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u);
  }
}

// Each loop larger than the one before: a worker late from loop G must never
// run an index of loop G + 1 under G's claim (it would run twice, and the
// caller could return before the loop's last index finished).
TEST(WorkPoolTest, GrowingLoopsRunEachIndexOnce) {
  WorkPool pool(3);
  for (int loop = 0; loop < 5000; ++loop) {
    const int64_t n = 2 + loop % 64;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int64_t> finished{0};
    pool.ParallelFor(n, [&](int64_t i) {
      hits[static_cast<size_t>(i)].fetch_add(1);
      finished.fetch_add(1);
    });
    ASSERT_EQ(finished.load(), n) << "loop " << loop << " returned early";
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "loop " << loop << " index " << i;
    }
  }
}

TEST(WorkPoolTest, NestedCallRunsInlineOnItsThread) {
  WorkPool pool(2);
  std::vector<std::atomic<int>> hits(4 * 8);
  std::atomic<int> off_thread{0};
  pool.ParallelFor(4, [&](int64_t outer) {
    const std::thread::id self = std::this_thread::get_id();
    pool.ParallelFor(8, [&](int64_t inner) {
      if (std::this_thread::get_id() != self) off_thread.fetch_add(1);
      hits[static_cast<size_t>(outer * 8 + inner)].fetch_add(1);
    });
  });
  EXPECT_EQ(off_thread.load(), 0);
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i;
}

// Two threads share one pool: their loops run one after the other, each
// index once.
TEST(WorkPoolTest, CallersOnTwoThreadsTakeTurns) {
  WorkPool pool(2);
  constexpr int kLoops = 500;
  std::atomic<int> inside{0}, overlapped{0};
  auto drive = [&](int64_t n) {
    for (int loop = 0; loop < kLoops; ++loop) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelFor(n, [&](int64_t i) {
        if (i == 0 && inside.fetch_add(1) != 0) overlapped.fetch_add(1);
        hits[static_cast<size_t>(i)].fetch_add(1);
        if (i == 0) inside.fetch_sub(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1);
    }
  };
  std::thread other([&] { drive(7); });
  drive(13);
  other.join();
  EXPECT_EQ(overlapped.load(), 0);
}

TEST(WorkPoolTest, OneThreadRunsOnTheCallerInOrder) {
  WorkPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<int64_t> order;
  pool.ParallelFor(5, [&](int64_t i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  pool.ParallelFor(0, [&](int64_t) { ADD_FAILURE() << "no index to run"; });
}

TEST(WorkPoolTest, DestroysWhileWorkersSleep) {
  for (int i = 0; i < 20; ++i) {
    WorkPool pool(3);
    std::atomic<int> count{0};
    pool.ParallelFor(10, [&](int64_t) { count.fetch_add(1); });
    EXPECT_EQ(count.load(), 10);
    if (i % 2 == 0) std::this_thread::sleep_for(WorkPool::kSpin * 2);
  }
}

}  // namespace
}  // namespace pdserve::engine::cpu
