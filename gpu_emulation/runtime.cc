// Emulated CUDA runtime: errors, device, memory, streams, events, stream
// capture and graphs. See cuda_runtime.h for the model.
#include <cxxabi.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "gpu_emulation/internal.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace pdserve::gpuemu {
namespace {

constexpr size_t kTotalMemory = size_t{80} << 30;
constexpr size_t kDefaultSharedBytes = 48 << 10;
constexpr size_t kOptinSharedBytes = 227 << 10;
constexpr size_t kAllocationAlignment = 256;

thread_local cudaError_t t_last_error = cudaSuccess;

// Process-lifetime state is leaked, never destroyed: stream threads may
// still run while static destructors would.
std::mutex g_error_mu;
cudaError_t g_sticky = cudaSuccess;           // guarded by g_error_mu
std::string& g_failure = *new std::string();  // guarded by g_error_mu

struct Allocation {
  size_t size;
  bool device;
};
std::mutex g_mem_mu;
std::map<uintptr_t, Allocation>& g_allocations =
    *new std::map<uintptr_t, Allocation>();  // guarded by g_mem_mu
size_t g_device_bytes = 0;                   // guarded by g_mem_mu

// Streams and events are shared_ptr-owned so queued tasks that refer to
// them outlive cudaStreamDestroy / cudaEventDestroy, as in CUDA.
std::mutex g_registry_mu;
std::map<Stream*, std::shared_ptr<Stream>>& g_streams =
    *new std::map<Stream*, std::shared_ptr<Stream>>();  // guarded by g_registry_mu
std::map<Event*, std::shared_ptr<Event>>& g_events =
    *new std::map<Event*, std::shared_ptr<Event>>();  // guarded by g_registry_mu
std::map<const void*, size_t>& g_max_dynamic_shared =
    *new std::map<const void*, size_t>();  // guarded by g_registry_mu

// Active captures, guarded by CaptureMutex().
std::vector<std::shared_ptr<Capture>>& g_captures = *new std::vector<std::shared_ptr<Capture>>();

std::shared_ptr<Stream> LegacyDefault() {
  static std::shared_ptr<Stream>* stream = [] {
    auto* s = new std::shared_ptr<Stream>(std::make_shared<Stream>(cudaStreamDefault, true));
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_streams[s->get()] = *s;
    return s;
  }();
  return *stream;
}

std::shared_ptr<Stream> SharedStream(cudaStream_t s) {
  if (s == nullptr) return LegacyDefault();
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = g_streams.find(s);
  return it == g_streams.end() ? nullptr : it->second;
}

std::shared_ptr<Event> SharedEvent(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = g_events.find(e);
  return it == g_events.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Stream>> AllStreams() {
  LegacyDefault();
  std::lock_guard<std::mutex> lock(g_registry_mu);
  std::vector<std::shared_ptr<Stream>> out;
  for (auto& [raw, s] : g_streams) out.push_back(s);
  return out;
}

// Marks `c` invalid (first reason wins). Needs CaptureMutex().
void Invalidate(Capture& c, cudaError_t why) {
  if (c.invalid == cudaSuccess) c.invalid = why;
}

// Whether a capture is active that forbids a potentially unsafe call
// (cudaMalloc, device-wide synchronisation) from this thread; invalidates
// it. Needs CaptureMutex().
bool UnsafeCallDuringCapture() {
  bool found = false;
  for (auto& c : g_captures) {
    const bool applies =
        c->mode == cudaStreamCaptureModeGlobal ||
        (c->mode == cudaStreamCaptureModeThreadLocal && c->thread == std::this_thread::get_id());
    if (applies) {
      Invalidate(*c, cudaErrorStreamCaptureUnsupported);
      found = true;
    }
  }
  return found;
}

}  // namespace

bool AllocationRange(const void* p, void** base, size_t* size) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mem_mu);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return false;
  --it;
  if (!it->second.device || a >= it->first + it->second.size) return false;
  *base = reinterpret_cast<void*>(it->first);
  *size = it->second.size;
  return true;
}

bool PinnedRange(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mem_mu);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return false;
  --it;
  return !it->second.device && a + n <= it->first + it->second.size && a + n >= a;
}

bool DeviceRange(const void* p, size_t n) {
  void* base = nullptr;
  size_t size = 0;
  if (!AllocationRange(p, &base, &size)) return false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a + n <= reinterpret_cast<uintptr_t>(base) + size && a + n >= a;
}

namespace {

// Whether p points into a device allocation at all.
bool IsDevicePointer(const void* p) { return DeviceRange(p, 1); }

cudaError_t CheckCopy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  bool dst_device, src_device;
  switch (kind) {
    case cudaMemcpyHostToHost:
      dst_device = src_device = false;
      break;
    case cudaMemcpyHostToDevice:
      dst_device = true;
      src_device = false;
      break;
    case cudaMemcpyDeviceToHost:
      dst_device = false;
      src_device = true;
      break;
    case cudaMemcpyDeviceToDevice:
      dst_device = src_device = true;
      break;
    case cudaMemcpyDefault:
      dst_device = IsDevicePointer(dst);
      src_device = IsDevicePointer(src);
      break;
    default:
      return cudaErrorInvalidMemcpyDirection;
  }
  // A device side must lie inside one allocation; a host side must not be
  // device memory (the kind would be a lie).
  if (dst_device ? !DeviceRange(dst, count)
                 : (kind != cudaMemcpyHostToHost && IsDevicePointer(dst)))
    return cudaErrorInvalidValue;
  if (src_device ? !DeviceRange(src, count)
                 : (kind != cudaMemcpyHostToHost && IsDevicePointer(src)))
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t Fail(cudaError_t e) { return SetLastError(e); }

// Waits for everything queued so far on every stream.
void WaitAll() {
  for (auto& s : AllStreams()) s->WaitFor(s->Ticket());
}

cudaError_t SyncResult() {
  const cudaError_t sticky = StickyError();
  return sticky == cudaSuccess ? cudaSuccess : Fail(sticky);
}

}  // namespace

// ---- Stream ----

Stream::Stream(unsigned int flags, bool legacy_default)
    : flags(flags), legacy_default(legacy_default), worker_([this] { Loop(); }) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.get_id() == std::this_thread::get_id()) {
    worker_.detach();
  } else {
    worker_.join();
  }
}

void Stream::Push(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ++pushed_;
  }
  cv_.notify_all();
}

uint64_t Stream::Ticket() {
  std::lock_guard<std::mutex> lock(mu_);
  return pushed_;
}

void Stream::WaitFor(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= ticket; });
}

bool Stream::Done(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= ticket;
}

void Stream::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (!task.skippable || StickyError() == cudaSuccess) task.run();
    task = {};
    lock.lock();
    ++completed_;
    cv_.notify_all();
  }
}

std::mutex& CaptureMutex() {
  static std::mutex mu;
  return mu;
}

Stream* Resolve(cudaStream_t s) { return s == nullptr ? LegacyDefault().get() : s; }

cudaError_t Submit(cudaStream_t handle, Task task) {
  if (const cudaError_t sticky = StickyError(); sticky != cudaSuccess) return Fail(sticky);
  std::shared_ptr<Stream> s = SharedStream(handle);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    if (s->capture) {
      Capture& c = *s->capture;
      if (c.invalid != cudaSuccess) return Fail(cudaErrorStreamCaptureInvalidated);
      c.nodes.push_back({std::move(task)});
      ++c.version[s.get()];
      if (s.get() != c.origin) c.unjoined.insert(s.get());
      return cudaSuccess;
    }
    if (s->legacy_default) {
      // The legacy stream would wait for a blocking stream being captured.
      for (auto& c : g_captures) {
        for (auto& [member, version] : c->version) {
          if (!(member->flags & cudaStreamNonBlocking)) {
            Invalidate(*c, cudaErrorStreamCaptureImplicit);
            return Fail(cudaErrorStreamCaptureImplicit);
          }
        }
      }
    }
  }
  if (s->legacy_default) {
    for (auto& other : AllStreams()) {
      if (other == s || (other->flags & cudaStreamNonBlocking)) continue;
      const uint64_t ticket = other->Ticket();
      if (!other->Done(ticket)) s->Push({[other, ticket] { other->WaitFor(ticket); }, false});
    }
  } else if (!(s->flags & cudaStreamNonBlocking)) {
    std::shared_ptr<Stream> d = LegacyDefault();
    const uint64_t ticket = d->Ticket();
    if (!d->Done(ticket)) s->Push({[d, ticket] { d->WaitFor(ticket); }, false});
  }
  s->Push(std::move(task));
  return cudaSuccess;
}

void SetStickyError(cudaError_t error, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_error_mu);
  if (g_sticky == cudaSuccess) {
    g_sticky = error;
    g_failure = message;
  }
}

cudaError_t StickyError() {
  std::lock_guard<std::mutex> lock(g_error_mu);
  return g_sticky;
}

cudaError_t SetLastError(cudaError_t error) {
  if (error != cudaSuccess) t_last_error = error;
  return error;
}

const char* LastFailureMessage() {
  thread_local std::string copy;
  std::lock_guard<std::mutex> lock(g_error_mu);
  copy = g_failure;
  return copy.c_str();
}

std::string KernelName(const void* func) {
  Dl_info info;
  if (dladdr(func, &info) != 0 && info.dli_sname != nullptr) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string name = status == 0 && demangled ? demangled : info.dli_sname;
    std::free(demangled);
    return name;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "kernel@%p", func);
  return buf;
}

size_t MaxDynamicShared(const void* func) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = g_max_dynamic_shared.find(func);
  return it == g_max_dynamic_shared.end() ? kDefaultSharedBytes : it->second;
}

}  // namespace pdserve::gpuemu

using namespace pdserve::gpuemu;  // NOLINT: this file implements the C API

// ---- errors ----

cudaError_t cudaGetLastError() {
  const cudaError_t sticky = StickyError();
  if (sticky != cudaSuccess) return sticky;
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  const cudaError_t sticky = StickyError();
  return sticky != cudaSuccess ? sticky : t_last_error;
}

namespace {
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not initiated in this stream"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const ErrorText* FindError(cudaError_t e) {
  for (const ErrorText& t : kErrors) {
    if (t.code == e) return &t;
  }
  return nullptr;
}
}  // namespace

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* t = FindError(error);
  return t ? t->text : "unrecognized error code";
}

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* t = FindError(error);
  return t ? t->name : "cudaErrorUnknown";
}

// ---- device ----

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : Fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return Fail(cudaErrorInvalidValue);
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  *prop = {};
  std::snprintf(prop->name, sizeof prop->name, "pdserve GPU emulation (H100 SXM limits)");
  prop->totalGlobalMem = kTotalMemory;
  prop->sharedMemPerBlock = kDefaultSharedBytes;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->clockRate = 1980000;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->memoryClockRate = 2619000;
  prop->memoryBusWidth = 5120;
  prop->l2CacheSize = 50 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->sharedMemPerBlockOptin = kOptinSharedBytes;
  prop->concurrentKernels = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device) {
  if (pci_bus_id == nullptr || len <= 0) return Fail(cudaErrorInvalidValue);
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  const unsigned pid = static_cast<unsigned>(getpid());
  std::snprintf(pci_bus_id, static_cast<size_t>(len), "%04x:%02x:00.0", (pid >> 8) & 0xffff,
                pid & 0xff);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return Fail(cudaErrorInvalidValue);
  cudaDeviceProp prop;
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrClockRate:
      *value = prop.clockRate;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = prop.multiProcessorCount;
      return cudaSuccess;
    case cudaDevAttrMemoryClockRate:
      *value = prop.memoryClockRate;
      return cudaSuccess;
    case cudaDevAttrGlobalMemoryBusWidth:
      *value = prop.memoryBusWidth;
      return cudaSuccess;
  }
  return Fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize() {
  {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    if (UnsafeCallDuringCapture()) return Fail(cudaErrorStreamCaptureUnsupported);
  }
  WaitAll();
  return SyncResult();
}

cudaError_t cudaDeviceReset() {
  WaitAll();
  {
    std::lock_guard<std::mutex> lock(g_error_mu);
    g_sticky = cudaSuccess;
    g_failure.clear();
  }
  t_last_error = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return Fail(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return Fail(cudaErrorNotSupported);
  if (value < 0 || static_cast<size_t>(value) > kOptinSharedBytes)
    return Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_registry_mu);
  g_max_dynamic_shared[func] = static_cast<size_t>(value);
  return cudaSuccess;
}

// ---- memory ----

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    if (UnsafeCallDuringCapture()) return Fail(cudaErrorStreamCaptureUnsupported);
  }
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    if (size > kTotalMemory - g_device_bytes) return Fail(cudaErrorMemoryAllocation);
  }
  void* p = nullptr;
  if (posix_memalign(&p, kAllocationAlignment, size) != 0) return Fail(cudaErrorMemoryAllocation);
  std::memset(p, kPoison, size);
  std::lock_guard<std::mutex> lock(g_mem_mu);
  g_allocations[reinterpret_cast<uintptr_t>(p)] = {size, true};
  g_device_bytes += size;
  *ptr = p;
  return cudaSuccess;
}

namespace {
cudaError_t FreeAllocation(void* ptr, bool device) {
  if (ptr == nullptr) return cudaSuccess;
  // cudaFree synchronises the device: in-flight work may still use it.
  WaitAll();
  {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    auto it = g_allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_allocations.end() || it->second.device != device) {
      return Fail(device ? cudaErrorInvalidDevicePointer : cudaErrorInvalidValue);
    }
    if (device) g_device_bytes -= it->second.size;
    g_allocations.erase(it);
  }
  std::free(ptr);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaFree(void* ptr) { return FreeAllocation(ptr, true); }

namespace {
constexpr char kIpcMagic[8] = "pdsemu";
struct IpcBody {
  char magic[8];
  int64_t pid;
  uintptr_t base;
  size_t size;
};
static_assert(sizeof(IpcBody) <= CUDA_IPC_HANDLE_SIZE);
}  // namespace

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* dev_ptr) {
  if (handle == nullptr) return Fail(cudaErrorInvalidValue);
  void* base = nullptr;
  size_t size = 0;
  if (!AllocationRange(dev_ptr, &base, &size) || base != dev_ptr) {
    return Fail(cudaErrorInvalidValue);
  }
  IpcBody body{};
  std::memcpy(body.magic, kIpcMagic, sizeof body.magic);
  body.pid = getpid();
  body.base = reinterpret_cast<uintptr_t>(base);
  body.size = size;
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &body, sizeof body);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** dev_ptr, cudaIpcMemHandle_t handle, unsigned int flags) {
  if (dev_ptr == nullptr) return Fail(cudaErrorInvalidValue);
  IpcBody body;
  std::memcpy(&body, handle.reserved, sizeof body);
  if (std::memcmp(body.magic, kIpcMagic, sizeof body.magic) != 0) {
    return Fail(cudaErrorInvalidValue);
  }
  return Fail(body.pid == getpid() ? cudaErrorInvalidResourceHandle : cudaErrorNotSupported);
}

cudaError_t cudaIpcCloseMemHandle(void* dev_ptr) { return Fail(cudaErrorInvalidValue); }

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = nullptr;
  if (posix_memalign(&p, kAllocationAlignment, size) != 0) return Fail(cudaErrorMemoryAllocation);
  std::memset(p, kPoison, size);
  std::lock_guard<std::mutex> lock(g_mem_mu);
  g_allocations[reinterpret_cast<uintptr_t>(p)] = {size, false};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) { return FreeAllocation(ptr, false); }

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mem_mu);
  *total = kTotalMemory;
  *free = kTotalMemory - g_device_bytes;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (const cudaError_t e = CheckCopy(dst, src, count, kind); e != cudaSuccess) return Fail(e);
  if (count == 0) return cudaSuccess;
  return Submit(stream, {[dst, src, count] { std::memmove(dst, src, count); }});
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, nullptr); e != cudaSuccess)
    return e;
  std::shared_ptr<Stream> d = LegacyDefault();
  d->WaitFor(d->Ticket());
  return SyncResult();
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!DeviceRange(dst, count)) return Fail(cudaErrorInvalidValue);
  return Submit(stream, {[dst, value, count] { std::memset(dst, value, count); }});
}

cudaError_t cudaMemset(void* dst, int value, size_t count) {
  if (const cudaError_t e = cudaMemsetAsync(dst, value, count, nullptr); e != cudaSuccess) return e;
  std::shared_ptr<Stream> d = LegacyDefault();
  d->WaitFor(d->Ticket());
  return SyncResult();
}

// ---- streams ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0)
    return Fail(cudaErrorInvalidValue);
  auto s = std::make_shared<Stream>(flags, false);
  std::lock_guard<std::mutex> lock(g_registry_mu);
  g_streams[s.get()] = s;
  *stream = s.get();
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    std::lock_guard<std::mutex> reg(g_registry_mu);
    auto it = g_streams.find(stream);
    if (it == g_streams.end()) return Fail(cudaErrorInvalidResourceHandle);
    if (it->second->capture) return Fail(cudaErrorStreamCaptureUnsupported);
    s = std::move(it->second);
    g_streams.erase(it);
  }
  // Pending work completes first (CUDA returns at once and finishes it).
  s->WaitFor(s->Ticket());
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::shared_ptr<Stream> s = SharedStream(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    if (s->capture) {
      Invalidate(*s->capture, cudaErrorStreamCaptureUnsupported);
      return Fail(cudaErrorStreamCaptureUnsupported);
    }
  }
  if (s->legacy_default) {
    // The legacy stream's synchronisation covers the blocking streams' work.
    if (const cudaError_t e = Submit(nullptr, {[] {}, false}); e != cudaSuccess) return e;
  }
  s->WaitFor(s->Ticket());
  return SyncResult();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::shared_ptr<Stream> s = SharedStream(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    if (s->capture) {
      Invalidate(*s->capture, cudaErrorStreamCaptureUnsupported);
      return Fail(cudaErrorStreamCaptureUnsupported);
    }
  }
  if (const cudaError_t sticky = StickyError(); sticky != cudaSuccess) return Fail(sticky);
  return s->Done(s->Ticket()) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  std::shared_ptr<Stream> s = SharedStream(stream);
  std::shared_ptr<Event> e = SharedEvent(event);
  if (!s || !e) return Fail(cudaErrorInvalidResourceHandle);
  if (flags != 0) return Fail(cudaErrorInvalidValue);
  {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    if (e->capture) {
      std::shared_ptr<Capture> c = e->capture;
      if (c->origin->capture != c) return cudaSuccess;  // capture ended: nothing to wait for
      if (!s->capture) {
        if (s->legacy_default) return Fail(cudaErrorStreamCaptureImplicit);
        s->capture = c;  // fork: s joins the capture
        c->version[s.get()];
      } else if (s->capture != c) {
        return Fail(cudaErrorStreamCaptureIsolation);
      }
      if (c->invalid != cudaSuccess) return Fail(cudaErrorStreamCaptureInvalidated);
      // s now depends on the recording stream's work up to the record.
      if (e->capture_stream != s.get() && e->capture_position == c->version[e->capture_stream]) {
        c->unjoined.erase(e->capture_stream);
      }
      ++c->version[s.get()];
      if (s.get() != c->origin) c->unjoined.insert(s.get());
      return cudaSuccess;
    }
    if (s->capture) {
      // A captured stream may not depend on work outside the capture.
      std::lock_guard<std::mutex> elock(e->mu);
      if (e->recorded == 0) return cudaSuccess;
      Invalidate(*s->capture, cudaErrorStreamCaptureIsolation);
      return Fail(cudaErrorStreamCaptureIsolation);
    }
  }
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    seq = e->recorded;
  }
  if (seq == 0) return cudaSuccess;  // never recorded: nothing to wait for
  return Submit(stream, {[e, seq] {
                           std::unique_lock<std::mutex> lock(e->mu);
                           e->cv.wait(lock, [&] { return e->completed >= seq; });
                         },
                         false});
}

// ---- events ----

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return Fail(cudaErrorInvalidValue);
  }
  auto e = std::make_shared<Event>(flags);
  std::lock_guard<std::mutex> lock(g_registry_mu);
  g_events[e.get()] = e;
  *event = e.get();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  if (g_events.erase(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::shared_ptr<Stream> s = SharedStream(stream);
  std::shared_ptr<Event> e = SharedEvent(event);
  if (!s || !e) return Fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    if (s->capture) {
      if (s->capture->invalid != cudaSuccess) return Fail(cudaErrorStreamCaptureInvalidated);
      e->capture = s->capture;
      e->capture_stream = s.get();
      e->capture_position = s->capture->version[s.get()];
      return cudaSuccess;
    }
    e->capture = nullptr;
  }
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    seq = ++e->recorded;
  }
  const cudaError_t err = Submit(stream, {[e, seq] {
                                            {
                                              std::lock_guard<std::mutex> lock(e->mu);
                                              if (seq > e->completed) {
                                                e->completed = seq;
                                                e->time = std::chrono::steady_clock::now();
                                              }
                                            }
                                            e->cv.notify_all();
                                          },
                                          false});
  if (err != cudaSuccess) {
    // Not enqueued: do not leave waiters behind a record that never runs.
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->recorded == seq) --e->recorded;
  }
  return err;
}

namespace {
bool Captured(const Event& e) {
  std::lock_guard<std::mutex> lock(CaptureMutex());
  return e.capture != nullptr;
}
}  // namespace

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::shared_ptr<Event> e = SharedEvent(event);
  if (!e) return Fail(cudaErrorInvalidResourceHandle);
  if (Captured(*e)) return Fail(cudaErrorCapturedEvent);
  if (const cudaError_t sticky = StickyError(); sticky != cudaSuccess) return Fail(sticky);
  std::lock_guard<std::mutex> lock(e->mu);
  return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::shared_ptr<Event> e = SharedEvent(event);
  if (!e) return Fail(cudaErrorInvalidResourceHandle);
  if (Captured(*e)) return Fail(cudaErrorCapturedEvent);
  {
    std::unique_lock<std::mutex> lock(e->mu);
    const uint64_t seq = e->recorded;
    e->cv.wait(lock, [&] { return e->completed >= seq; });
  }
  return SyncResult();
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  std::shared_ptr<Event> a = SharedEvent(start), b = SharedEvent(end);
  if (ms == nullptr) return Fail(cudaErrorInvalidValue);
  if (!a || !b) return Fail(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return Fail(cudaErrorInvalidResourceHandle);
  if (Captured(*a) || Captured(*b)) return Fail(cudaErrorCapturedEvent);
  std::chrono::steady_clock::time_point ta, tb;
  for (auto [e, t] : {std::pair{a.get(), &ta}, std::pair{b.get(), &tb}}) {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->recorded == 0) return Fail(cudaErrorInvalidResourceHandle);
    if (e->completed < e->recorded) return Fail(cudaErrorNotReady);
    *t = e->time;
  }
  *ms = std::chrono::duration<float, std::milli>(tb - ta).count();
  return cudaSuccess;
}

// ---- stream capture and graphs ----

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  std::shared_ptr<Stream> s = SharedStream(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  if (s->legacy_default) return Fail(cudaErrorStreamCaptureUnsupported);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return Fail(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lock(CaptureMutex());
  if (s->capture) return Fail(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->origin = s.get();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->version[s.get()] = 0;
  s->capture = c;
  g_captures.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return Fail(cudaErrorInvalidValue);
  std::shared_ptr<Stream> s = SharedStream(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(CaptureMutex());
  std::shared_ptr<Capture> c = s->capture;
  if (!c) return Fail(cudaErrorIllegalState);
  if (c->origin != s.get()) return Fail(cudaErrorStreamCaptureUnmatched);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    return Fail(cudaErrorStreamCaptureWrongThread);
  }
  for (auto& [member, version] : c->version) member->capture = nullptr;
  std::erase(g_captures, c);
  *graph = nullptr;
  if (c->invalid != cudaSuccess) return Fail(cudaErrorStreamCaptureInvalidated);
  if (!c->unjoined.empty()) return Fail(cudaErrorStreamCaptureUnjoined);
  *graph = new Graph{std::move(c->nodes)};
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return Fail(cudaErrorInvalidValue);
  std::shared_ptr<Stream> s = SharedStream(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(CaptureMutex());
  if (!s->capture) {
    *status = cudaStreamCaptureStatusNone;
  } else {
    *status = s->capture->invalid != cudaSuccess ? cudaStreamCaptureStatusInvalidated
                                                 : cudaStreamCaptureStatusActive;
  }
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  if (exec == nullptr || graph == nullptr) return Fail(cudaErrorInvalidValue);
  if (flags != 0) return Fail(cudaErrorNotSupported);
  *exec = new GraphExec{graph->nodes};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return Fail(cudaErrorInvalidValue);
  for (const GraphNode& node : exec->nodes) {
    if (const cudaError_t e = Submit(stream, node.task); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
