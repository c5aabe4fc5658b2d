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
