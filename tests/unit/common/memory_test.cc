// ReleaseFreedMemory hands the pages of freed heap memory back to the
// system: resident memory after many small allocations are freed (what a
// parsed 60 MiB request leaves) falls once it runs.
#include "common/memory.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0;
  int64_t resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(MemoryTest, FreedSmallAllocationsLeaveTheProcess) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "malloc_trim is glibc's";
#endif
#if defined(__SANITIZE_ADDRESS__)
  // ASan replaces glibc's malloc with its own allocator (freed memory sits
  // in its quarantine), so there is no glibc heap for malloc_trim to return;
  // the normal build runs this test.
  GTEST_SKIP() << "AddressSanitizer's allocator replaces glibc malloc";
#endif
  ReleaseFreedMemory();
  const int64_t before = ResidentBytes();
  constexpr int64_t kBytes = int64_t{256} << 20;
  constexpr size_t kBlock = 2000;  // below the mmap threshold: heap chunks
  constexpr size_t kKeepEvery = 64;
  // Every 64th block outlives the others, as a few objects of a request
  // outlive it: the heap cannot shrink from its top, so free() returns
  // nothing of the holes between them.
  std::vector<std::unique_ptr<char[]>> kept;
  {
    std::vector<std::unique_ptr<char[]>> blocks;
    blocks.reserve(kBytes / kBlock);
    for (int64_t done = 0; done < kBytes; done += kBlock) {
      blocks.emplace_back(new char[kBlock]);
      std::memset(blocks.back().get(), static_cast<int>(blocks.size()), kBlock);
    }
    // Read back, so that no allocation can be optimized away.
    int64_t sum = 0;
    for (const auto& b : blocks) sum += b[kBlock / 2];
    EXPECT_NE(sum, 0);
    for (size_t i = 0; i < blocks.size(); i += kKeepEvery) kept.push_back(std::move(blocks[i]));
  }
  const int64_t freed = ResidentBytes();
  ReleaseFreedMemory();
  const int64_t released = ResidentBytes();
  // The pages were resident after free(), and most went back.
  EXPECT_GT(freed - before, kBytes / 2) << before << " " << freed;
  EXPECT_LT(released - before, kBytes / 8) << before << " " << released;
}

}  // namespace
}  // namespace pdserve
