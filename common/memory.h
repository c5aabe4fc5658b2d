// Handing freed heap memory back to the system after an oversized request.
//
// glibc keeps memory a thread freed in its arena for reuse; after a request
// of tens of MiB (its bytes, the copies parsing makes, millions of small JSON
// nodes) the process keeps that peak resident for good. malloc_trim(0)
// releases the free pages of every arena (not only the top of the heap). It
// takes each arena's lock in turn, so it runs only after large requests,
// never per token or per ordinary request.
#pragma once

#include <cstdint>

namespace pdserve {

// For processes that hold client requests (the router): fixes glibc's mmap
// threshold at 1 MiB and its trim threshold at 2 MiB. By default both grow
// with the largest block freed (up to 32 and 64 MiB), after which the
// buffers of a large request live in thread arenas whose free top
// malloc_trim cannot return (measured: 2 x 53 MB kept after four 60 MiB
// bodies). Fixed, a block of 1 MiB or more is its own mapping, unmapped
// when freed, and an arena keeps at most 2 MiB free at its top. Not for
// workers: their per-step buffers of several MiB would be mapped and faulted
// in anew each step. Call once, early in main.
void ConfigureAllocatorForRequests();

// Requests at least this large (bytes of the request message or body) are
// followed by ReleaseFreedMemory.
inline constexpr int64_t kTrimAfterRequestBytes = int64_t{1} << 20;

// Returns free heap pages to the system (glibc: malloc_trim(0); elsewhere a
// no-op). Thread-safe. Calls made while one runs return at once and make
// the running one trim once more when it is done, so what they freed is
// released too.
void ReleaseFreedMemory();

// Calls ReleaseFreedMemory on destruction when `bytes` >= `threshold`.
// Declare it before the objects holding the request, so that they are freed
// first.
class ReleaseFreedMemoryAfter {
 public:
  explicit ReleaseFreedMemoryAfter(int64_t threshold = kTrimAfterRequestBytes)
      : threshold_(threshold) {}
  ~ReleaseFreedMemoryAfter() {
    if (threshold_ > 0 && bytes_ >= threshold_) ReleaseFreedMemory();
  }
  ReleaseFreedMemoryAfter(const ReleaseFreedMemoryAfter&) = delete;
  ReleaseFreedMemoryAfter& operator=(const ReleaseFreedMemoryAfter&) = delete;

  void set_bytes(int64_t bytes) { bytes_ = bytes; }

 private:
  const int64_t threshold_;
  int64_t bytes_ = 0;
};

}  // namespace pdserve
