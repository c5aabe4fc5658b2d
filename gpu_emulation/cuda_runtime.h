// CPU emulation of the CUDA runtime API subset pdserve uses, under the real
// names, so CUDA sources compile unchanged as C++ (see README.md).
//
// What it proves: logic, indexing, launch configuration and the ordering of
// work between streams, events, host and graphs. What it cannot prove: speed,
// register pressure, memory-model races inside a kernel, or coalescing.
//
// Model:
//   * Device memory is host memory from cudaMalloc, tracked by range; fresh
//     allocations are filled with 0xff bytes (NaN as f32, bf16 and f16).
//     Copies check that device-side ranges lie inside one live allocation.
//     Kernels can dereference any pointer (unlike a GPU); build with ASan
//     to catch out-of-bounds accesses inside allocations' neighbourhoods.
//   * Each stream runs its work in order on an OS thread of its own; events
//     order streams. The legacy default stream (0) is implicitly
//     synchronised with blocking streams, as in CUDA; cudaStreamNonBlocking
//     streams are not. Every async copy is truly async (stricter than CUDA
//     for pageable host memory): read results only after a synchronisation.
//   * A kernel failure (see device.h for the rules) is sticky, as on a GPU:
//     later work is skipped and calls return cudaErrorLaunchFailure until
//     cudaDeviceReset, which clears the error but (unlike CUDA) keeps
//     allocations alive.
//   * Stream capture records the work of the capturing stream and of streams
//     that join it through events (fork/join); a graph replays it in capture
//     order on the launch stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpu_emulation/device.h"
#include "gpu_emulation/float16.h"

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorUnknown = 999,
};
using cudaError_t = cudaError;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
// The attributes cudaDeviceGetAttribute answers (CUDA 13 dropped the clock
// fields from cudaDeviceProp: these are where they are read now).
enum cudaDeviceAttr {
  cudaDevAttrClockRate = 13,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMemoryClockRate = 36,
  cudaDevAttrGlobalMemoryBusWidth = 37,
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

inline constexpr unsigned int cudaStreamDefault = 0x0;
inline constexpr unsigned int cudaStreamNonBlocking = 0x1;
inline constexpr unsigned int cudaEventDefault = 0x0;
inline constexpr unsigned int cudaEventBlockingSync = 0x1;
inline constexpr unsigned int cudaEventDisableTiming = 0x2;
inline constexpr unsigned int cudaHostAllocDefault = 0x0;
inline constexpr unsigned int cudaIpcMemLazyEnablePeerAccess = 0x1;

#define CUDA_IPC_HANDLE_SIZE 64
struct cudaIpcMemHandle_t {
  char reserved[CUDA_IPC_HANDLE_SIZE];
};

namespace pdserve::gpuemu {
struct Stream;
struct Event;
struct Graph;
struct GraphExec;
}  // namespace pdserve::gpuemu
using cudaStream_t = pdserve::gpuemu::Stream*;
using cudaEvent_t = pdserve::gpuemu::Event*;
using cudaGraph_t = pdserve::gpuemu::Graph*;
using cudaGraphExec_t = pdserve::gpuemu::GraphExec*;

// The fields of cudaDeviceProp the project reads, with the limits of an
// H100 SXM (the emulation enforces maxThreadsPerBlock, maxThreadsDim,
// maxGridSize, sharedMemPerBlock and sharedMemPerBlockOptin).
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int clockRate;  // kHz
  int major;
  int minor;
  int multiProcessorCount;
  int memoryClockRate;  // kHz
  int memoryBusWidth;   // bits
  int l2CacheSize;
  int maxThreadsPerMultiProcessor;
  size_t sharedMemPerMultiprocessor;
  size_t sharedMemPerBlockOptin;
  int concurrentKernels;
};

// ---- errors ----
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

// ---- device ----
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
// Each emulating process owns a GPU of its own: its bus id differs from any
// other process's, so two processes never share a device (see IPC below).
cudaError_t cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceReset();
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
template <typename T>
cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}

// ---- memory ----
cudaError_t cudaMalloc(void** ptr, size_t size);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t size) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), size);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t size);
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t size) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t count);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream = nullptr);

// ---- interprocess memory ----
// A handle names a live allocation by its base pointer (any other pointer is
// cudaErrorInvalidValue, as in CUDA). Opening a handle works in no process:
// in the exporting one CUDA refuses it (cudaErrorInvalidResourceHandle here),
// and the emulation shares no memory across processes
// (cudaErrorNotSupported). Code that pairs two workers of one process uses
// the addresses themselves, which is also what it must do on a GPU.
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* dev_ptr);
cudaError_t cudaIpcOpenMemHandle(void** dev_ptr, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void* dev_ptr);

// ---- streams ----
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

// ---- events ----
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// ---- stream capture and graphs ----
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

namespace pdserve::gpuemu {

// The message of the most recent launch failure (which kernel, which block,
// which rule), or "" if none since cudaDeviceReset.
const char* LastFailureMessage();

// The live device allocation holding `p`: its base and size (what the
// driver API's cuMemGetAddressRange answers on a GPU). False if none.
bool AllocationRange(const void* p, void** base, size_t* size);

// Seed of the block scheduler (launch.cc): with the same seed, launch shape
// and block index, the warps of a block take their turns in the same order
// on every run. The default is kDefaultScheduleSeed, or PDSERVE_GPUEMU_SEED
// (a number) from the environment; a change applies to blocks that start
// afterwards (synchronise first).
inline constexpr uint64_t kDefaultScheduleSeed = 0x5eed;
void SetScheduleSeed(uint64_t seed);
uint64_t ScheduleSeed();

// Memory handed out again (a reused arena, workspace or staging buffer) is
// poisoned like fresh memory, so a read of what its new user did not write
// sees NaN or -1 rather than the last user's values. Project code calls
// these through engine/cuda/reuse_poison.h, which compiles them away under
// nvcc. PoisonReusedDevice fills device memory in order on `stream`
// (recorded when it captures); PoisonReusedHost fills pinned memory at once
// (no device work may still use it). Both return cudaErrorInvalidValue
// unless the range lies inside one live allocation of the kind.
cudaError_t PoisonReusedDevice(void* device, size_t bytes, cudaStream_t stream);
cudaError_t PoisonReusedHost(void* host, size_t bytes);
// Bytes poisoned by those two so far (for tests).
uint64_t ReusePoisonedBytes();

}  // namespace pdserve::gpuemu

#include "gpu_emulation/launch.h"
