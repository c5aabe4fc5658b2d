#include "common/memory.h"

#include <atomic>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace pdserve {

void ConfigureAllocatorForRequests() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 2 << 20);
#endif
}

void ReleaseFreedMemory() {
#if defined(__GLIBC__)
  // Calls since the running trim began (0: none runs).
  static std::atomic<int> calls{0};
  if (calls.fetch_add(1) != 0) return;
  while (true) {
    int seen = calls.load();
    malloc_trim(0);
    if (calls.compare_exchange_strong(seen, 0)) return;
    // More calls came during the trim: one more covers them all.
    calls.store(1);
  }
#endif
}

}  // namespace pdserve
