// Internals of the emulated runtime shared by runtime.cc, launch.cc,
// cublas.cc and nccl.cc. Not part of the emulated API.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpu_emulation/cuda_runtime.h"

namespace pdserve::gpuemu {

// Work a stream runs. `skippable` work (kernels, copies, GEMMs, transfers)
// is skipped once the device has a sticky error; ordering work (event
// records, waits) always runs so nothing waits forever.
struct Task {
  std::function<void()> run;
  bool skippable = true;
};

struct Capture;

struct Stream {
  explicit Stream(unsigned int flags, bool legacy_default);
  ~Stream();  // drains the queue and joins the worker

  // Appends `task` (no capture or implicit-sync logic: see Submit).
  void Push(Task task);
  // Number of tasks pushed so far; WaitFor(n) blocks until the first n ran.
  uint64_t Ticket();
  void WaitFor(uint64_t ticket);
  bool Done(uint64_t ticket);

  const unsigned int flags;
  const bool legacy_default;

  // Guarded by CaptureMutex().
  std::shared_ptr<Capture> capture;

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  uint64_t pushed_ = 0;     // guarded by mu_
  uint64_t completed_ = 0;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  std::thread worker_;      // last: starts after the fields above exist
};

struct Event {
  explicit Event(unsigned int flags) : flags(flags) {}
  const unsigned int flags;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;                       // records issued (guarded by mu)
  uint64_t completed = 0;                      // highest record that ran (guarded by mu)
  std::chrono::steady_clock::time_point time;  // of `completed` (guarded by mu)
  // Set when the latest record was captured (guarded by CaptureMutex()).
  std::shared_ptr<Capture> capture;
  Stream* capture_stream = nullptr;
  uint64_t capture_position = 0;  // capture_stream's Capture::version at the record
};

// One captured operation, replayed in capture order (a valid topological
// order of the captured dependencies).
struct GraphNode {
  Task task;
};

struct Capture {
  Stream* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  cudaError_t invalid = cudaSuccess;  // first error that invalidated it
  std::vector<GraphNode> nodes;
  // Per member stream (origin included): a counter of its captured
  // operations (work and waits), to tell whether an event names its latest.
  std::map<Stream*, uint64_t> version;
  std::set<Stream*> unjoined;  // members whose latest operation nothing depends on yet
};

struct Graph {
  std::vector<GraphNode> nodes;
};
struct GraphExec {
  std::vector<GraphNode> nodes;
};

std::mutex& CaptureMutex();

// The stream `s` names (nullptr: the legacy default stream).
Stream* Resolve(cudaStream_t s);

// Enqueues `task` on `s` with CUDA's semantics: recorded instead when `s`
// is capturing; ordered against the legacy default stream unless `s` is
// non-blocking. Returns the sticky error, a capture error, or cudaSuccess.
cudaError_t Submit(cudaStream_t s, Task task);

// Records the sticky device error (first one wins) with its message.
void SetStickyError(cudaError_t error, const std::string& message);
cudaError_t StickyError();

// Sets the calling thread's last error and returns `error`.
cudaError_t SetLastError(cudaError_t error);

// Runs every block of `launch`; returns "" or what failed.
std::string RunGrid(const KernelLaunch& launch);

// What fresh and reused memory is filled with: NaN as f32, bf16 and f16,
// -1 as integers.
inline constexpr unsigned char kPoison = 0xff;

// Whether [p, p + n) lies inside one live device allocation.
bool DeviceRange(const void* p, size_t n);
// Whether [p, p + n) lies inside one live cudaMallocHost allocation.
bool PinnedRange(const void* p, size_t n);

// The dynamic shared memory a launch of `func` may use.
size_t MaxDynamicShared(const void* func);

// Readable kernel name for messages.
std::string KernelName(const void* func);

}  // namespace pdserve::gpuemu
