// Emulated kernel launches: validation, the grid over worker threads, and
// the block scheduler that runs each block's threads as fibers.
//
// Block scheduler: every thread of the block is a Boost.Context fiber on a
// pooled stack, resumed until it blocks (at __syncthreads or a warp
// intrinsic) or exits. Between two barriers the warps take turns in an order
// drawn from the schedule seed, the launch shape and the block index (see
// RunInterval): mostly one warp runs ahead to the barrier before the next
// starts, sometimes all advance in lockstep. So a read of shared memory that
// lacks a barrier sees unwritten (poisoned) data in some block, and a write
// that lacks a barrier after other warps' reads (write-after-read)
// overwrites what a slower warp has yet to read. Within a warp the lanes run
// in ascending or descending order by turns. A warp group completes once
// all its lanes arrived; if at the end of an interval not every thread
// waits at the same barrier (or has exited), the block has diverged and the
// launch fails.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gpu_emulation/internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace pdserve::gpuemu {
namespace ctx = boost::context;

namespace {

// AddressSanitizer must be told about every stack switch, or it misreads
// exceptions thrown on fiber stacks. No-ops in other builds.
struct StackBounds {
  const void* bottom = nullptr;
  size_t size = 0;
};
#if defined(__SANITIZE_ADDRESS__)
void StartSwitch(void** fake_stack, const StackBounds& to) {
  __sanitizer_start_switch_fiber(fake_stack, to.bottom, to.size);
}
void FinishSwitch(void* fake_stack, StackBounds* from) {
  __sanitizer_finish_switch_fiber(fake_stack, from ? &from->bottom : nullptr,
                                  from ? &from->size : nullptr);
}
#else
void StartSwitch(void**, const StackBounds&) {}
void FinishSwitch(void*, StackBounds*) {}
#endif

constexpr unsigned kWarpLanes = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
constexpr unsigned kMaxGridDim[3] = {2147483647u, 65535, 65535};
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStackBytes = 1 << 20;  // ASan frames are large
#else
constexpr size_t kStackBytes = 256 << 10;
#endif

std::atomic<uint64_t> g_schedule_seed{[] {
  const char* env = std::getenv("PDSERVE_GPUEMU_SEED");
  return env != nullptr ? std::strtoull(env, nullptr, 0) : kDefaultScheduleSeed;
}()};

// SplitMix64: a small generator whose stream is fixed by its seed.
class ScheduleRng {
 public:
  explicit ScheduleRng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0 (the bias of a 64-bit modulus is negligible).
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(Next() % n); }

 private:
  uint64_t state_;
};

// The schedule of one block: fixed by the seed, the launch's shape and the
// block's index (not by the kernel's address, which moves between runs).
ScheduleRng BlockRng(uint64_t seed, const KernelLaunch& launch, unsigned block_linear) {
  ScheduleRng mix(seed);
  uint64_t h = mix.Next();
  for (uint64_t v : {uint64_t{launch.grid.x}, uint64_t{launch.grid.y}, uint64_t{launch.grid.z},
                     uint64_t{launch.block.x}, uint64_t{launch.block.y}, uint64_t{launch.block.z},
                     uint64_t{launch.shared_bytes}, uint64_t{block_linear}}) {
    h = ScheduleRng(h ^ v).Next();
  }
  return ScheduleRng(h);
}

// Fiber stacks, reused across blocks by the OS thread that owns the pool.
// Each stack has a guard page below it, so an overflow faults.
class StackPool {
 public:
  ~StackPool() {
    for (void* base : free_) munmap(base, kStackBytes + Page());
  }
  ctx::stack_context Allocate() {
    void* base;
    if (free_.empty()) {
      base = mmap(nullptr, kStackBytes + Page(), PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      mprotect(base, Page(), PROT_NONE);
    } else {
      base = free_.back();
      free_.pop_back();
    }
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(base) + Page() + kStackBytes;
#if defined(__SANITIZE_ADDRESS__)
    // A reused stack may still carry the last fiber's redzones.
    ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(base) + Page(), kStackBytes);
#endif
    return sc;
  }
  void Deallocate(ctx::stack_context& sc) {
    free_.push_back(static_cast<char*>(sc.sp) - kStackBytes - Page());
  }

 private:
  static size_t Page() {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
  }
  std::vector<void*> free_;
};

struct PooledStack {
  StackPool* pool;
  ctx::stack_context allocate() { return pool->Allocate(); }
  void deallocate(ctx::stack_context& sc) noexcept { pool->Deallocate(sc); }
};

// Thrown inside a fiber to end it after a trap.
struct TrapUnwind {};

// kTrapped: stopped by a trap, never resumed except to be abandoned.
enum class State { kRunnable, kBarrier, kWarpOp, kTrapped, kExited };

struct EmuThread {
  uint3 idx{};
  unsigned linear = 0;
  State state = State::kRunnable;
  const void* barrier_site = nullptr;
  detail::WarpOpKind op{};
  unsigned mask = 0;
  uint64_t value = 0;
  int param = 0;
  int width = 32;
  uint64_t result = 0;
  ctx::fiber fiber;   // the thread, while suspended (scheduler side)
  ctx::fiber caller;  // the scheduler, while the thread runs (fiber side)
  StackBounds stack;  // the fiber's stack
};

const char* OpName(detail::WarpOpKind k) {
  switch (k) {
    case detail::WarpOpKind::kShflIdx:
      return "__shfl_sync";
    case detail::WarpOpKind::kShflUp:
      return "__shfl_up_sync";
    case detail::WarpOpKind::kShflDown:
      return "__shfl_down_sync";
    case detail::WarpOpKind::kShflXor:
      return "__shfl_xor_sync";
    case detail::WarpOpKind::kBallot:
      return "__ballot_sync";
    case detail::WarpOpKind::kAny:
      return "__any_sync";
    case detail::WarpOpKind::kAll:
      return "__all_sync";
    case detail::WarpOpKind::kSyncWarp:
      return "__syncwarp";
  }
  return "?";
}

std::string Hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

class BlockRunner;
thread_local BlockRunner* t_runner = nullptr;
thread_local EmuThread* t_thread = nullptr;

class BlockRunner {
 public:
  // Runs block `block` of `launch`; returns "" or what went wrong.
  std::string Run(const KernelLaunch& launch, uint3 block, unsigned block_linear) {
    launch_ = &launch;
    error_.clear();
    const unsigned n = launch.block.x * launch.block.y * launch.block.z;
    blockIdx = block;
    blockDim = launch.block;
    gridDim = launch.grid;
    shared_.assign(launch.shared_bytes, 0xff);
    threads_.clear();
    threads_.resize(n);
    for (unsigned i = 0; i < n; ++i) {
      EmuThread& t = threads_[i];
      t.linear = i;
      t.idx = {i % launch.block.x, (i / launch.block.x) % launch.block.y,
               i / (launch.block.x * launch.block.y)};
      t.fiber =
          ctx::fiber(std::allocator_arg, PooledStack{&stacks_},
                     [this, &t](ctx::fiber&& scheduler) { return Body(t, std::move(scheduler)); });
    }
    t_runner = this;
    const unsigned warps = (n + kWarpLanes - 1) / kWarpLanes;
    order_.resize(warps);
    for (unsigned w = 0; w < warps; ++w) order_[w] = w;
    rng_ = BlockRng(ScheduleSeed(), launch, block_linear);
    turn_ = block_linear;
    while (error_.empty()) {
      RunInterval();
      if (!error_.empty()) break;
      unsigned exited = 0, at_barrier = 0;
      for (const EmuThread& t : threads_) {
        exited += t.state == State::kExited;
        at_barrier += t.state == State::kBarrier;
      }
      if (exited == n) break;
      if (at_barrier != n) {
        error_ = Stuck(exited, at_barrier);
        break;
      }
      const void* site = threads_[0].barrier_site;
      for (const EmuThread& t : threads_) {
        if (t.barrier_site != site) {
          error_ = "threads " + std::to_string(threads_[0].linear) + " and " +
                   std::to_string(t.linear) + " wait at different __syncthreads call sites";
          break;
        }
      }
      if (!error_.empty()) break;
      for (EmuThread& t : threads_) t.state = State::kRunnable;
    }
    if (!error_.empty()) Abandon();
    threads_.clear();
    t_runner = nullptr;
    return error_;
  }

  // Switches from the current emulated thread back to the scheduler; an
  // abandoned block resumes it with an exception that ends it.
  void Suspend() {
    EmuThread* t = t_thread;
    void* fake_stack = nullptr;
    StartSwitch(&fake_stack, scheduler_stack_);
    t->caller = std::move(t->caller).resume();
    FinishSwitch(fake_stack, &scheduler_stack_);
    if (abandoning_) throw TrapUnwind{};
  }

  void SyncThreads(const void* site) {
    EmuThread* t = t_thread;
    t->state = State::kBarrier;
    t->barrier_site = site;
    Suspend();
  }

  uint64_t WarpOp(detail::WarpOpKind kind, unsigned mask, uint64_t value, int param, int width) {
    EmuThread* t = t_thread;
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) BadWidth(kind, width);
    t->state = State::kWarpOp;
    t->op = kind;
    t->mask = mask;
    t->value = value;
    t->param = param;
    t->width = width;
    Suspend();
    return t->result;
  }

  void* Shared() { return shared_.empty() ? nullptr : shared_.data(); }

  // Fails the block: records `message` and parks the thread until the
  // scheduler abandons the block (the unwinding starts from Suspend, never
  // from a frame that is still building the message).
  [[noreturn]] void Trap(const char* message) {
    Record(message);
    Park();
  }

 private:
  void Record(const std::string& message) {
    if (error_.empty()) error_ = "thread " + std::to_string(t_thread->linear) + ": " + message;
  }

  [[noreturn]] void BadWidth(detail::WarpOpKind kind, int width) {
    Record(std::string(OpName(kind)) + ": width " + std::to_string(width) +
           " is not a power of two in [1, 32]");
    Park();
  }

  [[noreturn]] void Park() {
    t_thread->state = State::kTrapped;
    for (;;) Suspend();
  }

  // Runs the block from a barrier (or its start) until every thread waits
  // at the next barrier, has exited, or cannot go on. The warps take turns
  // in an order drawn from rng_, one of two ways, also drawn: mostly each
  // warp runs ahead alone through all its warp intrinsics up to the
  // barrier, so a warp may overwrite shared memory that a later warp has
  // not read yet; otherwise the warps advance in lockstep, one warp
  // intrinsic at a time, so accesses of different warps interleave.
  void RunInterval() {
    for (size_t i = order_.size(); i > 1; --i) {
      std::swap(order_[i - 1], order_[rng_.Below(static_cast<uint32_t>(i))]);
    }
    if (rng_.Below(4) != 0) {
      for (unsigned w : order_) {
        do {
          RunWarp(w);
        } while (error_.empty() && ResolveWarp(w));
        if (!error_.empty()) return;
      }
      return;
    }
    for (bool progressed = true; progressed && error_.empty();) {
      for (unsigned w : order_) {
        RunWarp(w);
        if (!error_.empty()) return;
      }
      progressed = false;
      for (unsigned w : order_) {
        progressed |= ResolveWarp(w);
        if (!error_.empty()) return;
      }
    }
  }

  // Resumes every runnable thread of warp `w` until it blocks or ends, the
  // lanes in ascending or descending order by turns, so that a read of
  // shared memory written by another lane without a barrier sees unwritten
  // data in some warp whichever way it looks.
  void RunWarp(unsigned w) {
    const unsigned n = static_cast<unsigned>(threads_.size());
    const unsigned base = w * kWarpLanes, lanes = std::min(kWarpLanes, n - base);
    const bool forward = turn_++ % 2 == 0;
    for (unsigned k = 0; k < lanes && error_.empty(); ++k) {
      EmuThread& t = threads_[base + (forward ? k : lanes - 1 - k)];
      if (t.state == State::kRunnable) Resume(t);
    }
    t_thread = nullptr;
  }

  // Resumes `t` until it suspends or ends.
  void Resume(EmuThread& t) {
    t_thread = &t;
    threadIdx = t.idx;
    void* fake_stack = nullptr;
    StartSwitch(&fake_stack, t.stack);
    t.fiber = std::move(t.fiber).resume();
    FinishSwitch(fake_stack, nullptr);
  }

  ctx::fiber Body(EmuThread& t, ctx::fiber&& scheduler) {
    FinishSwitch(nullptr, &scheduler_stack_);
    t.caller = std::move(scheduler);
    try {
      // A thread first resumed by Abandon (its warp never ran before the
      // block failed) ends without running the kernel.
      if (!abandoning_) launch_->body();
    } catch (const ctx::detail::forced_unwind&) {
      throw;
    } catch (const TrapUnwind&) {
    } catch (const std::exception& e) {
      if (error_.empty()) error_ = "thread " + std::to_string(t.linear) + " threw: " + e.what();
    } catch (...) {
      if (error_.empty()) error_ = "thread " + std::to_string(t.linear) + " threw";
    }
    t.state = State::kExited;
    StartSwitch(nullptr, scheduler_stack_);  // this fiber's stack is done
    return std::move(t.caller);
  }

  // Completes every group of warp `w` whose lanes have all arrived; records
  // an error for a group that can never complete. Returns whether any
  // completed.
  bool ResolveWarp(unsigned w) {
    const unsigned n = static_cast<unsigned>(threads_.size());
    const unsigned base = w * kWarpLanes;
    bool progressed = false;
    for (unsigned lane = 0; lane < kWarpLanes && base + lane < n; ++lane) {
      EmuThread& t = threads_[base + lane];
      if (t.state != State::kWarpOp) continue;
      const unsigned mask = t.mask;
      const std::string who = "thread " + std::to_string(t.linear) + " (" + OpName(t.op) +
                              ", mask " + Hex(mask) + "): ";
      if (!(mask >> lane & 1U)) {
        error_ = who + "the mask does not name the calling lane";
        return false;
      }
      bool complete = true;
      for (unsigned m = 0; m < kWarpLanes; ++m) {
        if (!(mask >> m & 1U)) continue;
        if (base + m >= n) {
          error_ = who + "lane " + std::to_string(m) + " of the mask does not exist (block of " +
                   std::to_string(n) + " threads)";
          return false;
        }
        const EmuThread& u = threads_[base + m];
        if (u.state == State::kExited) {
          error_ = who + "lane " + std::to_string(m) + " of the mask has exited";
          return false;
        }
        if (u.state == State::kWarpOp && (u.mask != mask || u.op != t.op)) {
          error_ = who + "lane " + std::to_string(m) + " is at " + OpName(u.op) + " with mask " +
                   Hex(u.mask);
          return false;
        }
        if (u.state != State::kWarpOp) complete = false;
      }
      if (!complete) continue;
      if (!Complete(base, mask)) return false;
      progressed = true;
    }
    return progressed;
  }

  // Computes the results of the warp group `mask` of the warp at `base`.
  bool Complete(unsigned base, unsigned mask) {
    uint64_t ballot = 0;
    for (unsigned m = 0; m < 32; ++m) {
      if ((mask >> m & 1U) && (threads_[base + m].value & 1U)) ballot |= uint64_t{1} << m;
    }
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (!(mask >> lane & 1U)) continue;
      EmuThread& t = threads_[base + lane];
      const unsigned w = static_cast<unsigned>(t.width);
      const unsigned segment = lane & ~(w - 1);
      const int p = t.param;
      unsigned src = lane;
      switch (t.op) {
        case detail::WarpOpKind::kShflIdx:
          src = segment + (static_cast<unsigned>(p) & (w - 1));
          break;
        case detail::WarpOpKind::kShflUp:
          src = lane - segment >= static_cast<unsigned>(p) ? lane - p : lane;
          break;
        case detail::WarpOpKind::kShflDown:
          src = lane - segment + static_cast<unsigned>(p) < w ? lane + p : lane;
          break;
        case detail::WarpOpKind::kShflXor:
          src = lane ^ static_cast<unsigned>(p);
          if (src >= segment + w) src = lane;
          break;
        case detail::WarpOpKind::kBallot:
          t.result = ballot;
          break;
        case detail::WarpOpKind::kAny:
          t.result = ballot != 0;
          break;
        case detail::WarpOpKind::kAll:
          t.result = ballot == mask;
          break;
        case detail::WarpOpKind::kSyncWarp:
          break;
      }
      const bool shuffle =
          t.op == detail::WarpOpKind::kShflIdx || t.op == detail::WarpOpKind::kShflUp ||
          t.op == detail::WarpOpKind::kShflDown || t.op == detail::WarpOpKind::kShflXor;
      if (shuffle) {
        if (src >= 32 || !(mask >> src & 1U)) {
          error_ = "thread " + std::to_string(t.linear) + " (" + OpName(t.op) + ", mask " +
                   Hex(mask) + "): reads lane " + std::to_string(src) + ", outside the mask";
          return false;
        }
        t.result = threads_[base + src].value;
      }
    }
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (mask >> lane & 1U) threads_[base + lane].state = State::kRunnable;
    }
    return true;
  }

  std::string Stuck(unsigned exited, unsigned at_barrier) const {
    const unsigned n = static_cast<unsigned>(threads_.size());
    const unsigned at_warp = n - exited - at_barrier;
    std::string s;
    if (at_barrier > 0) {
      s = "__syncthreads reached by " + std::to_string(at_barrier) + " of " + std::to_string(n) +
          " threads";
      if (exited > 0) s += "; " + std::to_string(exited) + " exited while others wait";
      if (at_warp > 0) s += "; " + std::to_string(at_warp) + " wait at warp intrinsics";
    } else {
      s = std::to_string(at_warp) + " threads wait at warp intrinsics whose lanes never arrive";
      for (const EmuThread& t : threads_) {
        if (t.state == State::kWarpOp) {
          s += " (first: thread " + std::to_string(t.linear) + ", " + OpName(t.op) + ", mask " +
               Hex(t.mask) + ")";
          break;
        }
      }
    }
    return s;
  }

  // Ends every fiber that has not finished, through the annotated switch
  // (a fiber destroyed unfinished would be unwound by Boost.Context behind
  // ASan's back): resumed, a suspended one throws TrapUnwind from its
  // suspension point, which unwinds the kernel's frames; one never started
  // ends at once.
  void Abandon() {
    abandoning_ = true;
    for (EmuThread& t : threads_) {
      if (t.fiber) Resume(t);
    }
    abandoning_ = false;
    t_thread = nullptr;
  }

  StackPool stacks_;             // outlives the fibers below
  StackBounds scheduler_stack_;  // the OS thread's stack, for ASan
  bool abandoning_ = false;
  std::vector<EmuThread> threads_;
  std::vector<unsigned> order_;  // warp indices, drawn per barrier interval
  ScheduleRng rng_{0};
  unsigned turn_ = 0;  // alternates the lane order of RunWarp
  std::vector<unsigned char> shared_;
  const KernelLaunch* launch_ = nullptr;
  std::string error_;
};

BlockRunner& ThisThreadRunner() {
  thread_local BlockRunner runner;
  return runner;
}

BlockRunner& CurrentRunner(const char* what) {
  if (t_runner == nullptr || t_thread == nullptr) {
    std::fprintf(stderr, "gpu_emulation: %s called outside a kernel\n", what);
    std::abort();
  }
  return *t_runner;
}

// ---- the grid over worker threads ----

struct GridJob {
  const KernelLaunch* launch;
  uint64_t total;
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;                 // guarded by mu: helpers that come later do nothing
  int active = 0;                      // guarded by mu: helpers inside Work()
  uint64_t failed_block = UINT64_MAX;  // guarded by mu
  std::string failure;                 // guarded by mu
  std::atomic<bool> stop{false};

  void Work() {
    BlockRunner& runner = ThisThreadRunner();
    const dim3 g = launch->grid;
    for (uint64_t b; !stop.load(std::memory_order_relaxed) && (b = next.fetch_add(1)) < total;) {
      const uint3 idx{static_cast<unsigned>(b % g.x), static_cast<unsigned>(b / g.x % g.y),
                      static_cast<unsigned>(b / (uint64_t{g.x} * g.y))};
      std::string error = runner.Run(*launch, idx, static_cast<unsigned>(b));
      if (!error.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        if (b < failed_block) {
          failed_block = b;
          failure = "block (" + std::to_string(idx.x) + "," + std::to_string(idx.y) + "," +
                    std::to_string(idx.z) + "): " + error;
        }
        stop = true;
      }
    }
  }
};

// Helper threads that run blocks of grids next to the stream threads.
class GridPool {
 public:
  static GridPool& Get() {
    static GridPool* pool = new GridPool();  // leaked: workers live as long as the process
    return *pool;
  }
  int helpers() const { return static_cast<int>(workers_.size()); }

  void Offer(const std::shared_ptr<GridJob>& job, int copies) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < copies; ++i) queue_.push_back(job);
    }
    cv_.notify_all();
  }

 private:
  GridPool() {
    int threads = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("PDSERVE_GPUEMU_THREADS")) threads = std::atoi(env);
    threads = std::clamp(threads, 1, 8);
    for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { Loop(); });
    for (auto& w : workers_) w.detach();
  }

  void Loop() {
    while (true) {
      std::shared_ptr<GridJob> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      {
        std::lock_guard<std::mutex> lock(job->mu);
        if (job->closed) continue;
        ++job->active;
      }
      job->Work();
      {
        std::lock_guard<std::mutex> lock(job->mu);
        --job->active;
      }
      job->cv.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GridJob>> queue_;  // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace

void SetScheduleSeed(uint64_t seed) { g_schedule_seed.store(seed, std::memory_order_relaxed); }
uint64_t ScheduleSeed() { return g_schedule_seed.load(std::memory_order_relaxed); }

std::string RunGrid(const KernelLaunch& launch) {
  auto job = std::make_shared<GridJob>();
  job->launch = &launch;
  job->total = uint64_t{launch.grid.x} * launch.grid.y * launch.grid.z;
  GridPool& pool = GridPool::Get();
  const int copies = static_cast<int>(std::min<uint64_t>(pool.helpers(), job->total - 1));
  if (copies > 0) pool.Offer(job, copies);
  job->Work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->closed = true;
  job->cv.wait(lock, [&] { return job->active == 0; });
  return job->failure;
}

cudaError_t LaunchKernel(KernelLaunch launch, cudaStream_t stream) {
  if (const cudaError_t sticky = StickyError(); sticky != cudaSuccess) return SetLastError(sticky);
  if (!launch.body || launch.func == nullptr) return SetLastError(cudaErrorInvalidDeviceFunction);
  const dim3 b = launch.block, g = launch.grid;
  const unsigned bd[3] = {b.x, b.y, b.z}, gd[3] = {g.x, g.y, g.z};
  for (int i = 0; i < 3; ++i) {
    if (bd[i] == 0 || bd[i] > kMaxBlockDim[i] || gd[i] == 0 || gd[i] > kMaxGridDim[i]) {
      return SetLastError(cudaErrorInvalidConfiguration);
    }
  }
  if (uint64_t{b.x} * b.y * b.z > kMaxThreadsPerBlock) {
    return SetLastError(cudaErrorInvalidConfiguration);
  }
  if (launch.shared_bytes > MaxDynamicShared(launch.func))
    return SetLastError(cudaErrorInvalidValue);
  auto shared = std::make_shared<KernelLaunch>(std::move(launch));
  return Submit(stream, {[shared] {
                  const std::string error = RunGrid(*shared);
                  if (!error.empty()) {
                    SetStickyError(cudaErrorLaunchFailure, KernelName(shared->func) + ": " + error);
                  }
                }});
}

namespace detail {

uint64_t WarpOp(WarpOpKind kind, unsigned int mask, uint64_t value, int param, int width) {
  return CurrentRunner(OpName(kind)).WarpOp(kind, mask, value, param, width);
}

void* DynamicSharedMemory() { return CurrentRunner("dynamic shared memory").Shared(); }

void Trap(const char* message) { CurrentRunner("__trap").Trap(message); }

}  // namespace detail
}  // namespace pdserve::gpuemu

__attribute__((noinline)) void __syncthreads() {
  pdserve::gpuemu::CurrentRunner("__syncthreads").SyncThreads(__builtin_return_address(0));
}
