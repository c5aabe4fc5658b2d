// Poison for memory handed out again (see cuda_runtime.h, PoisonReusedDevice).
#include <atomic>
#include <cstring>

#include "gpu_emulation/internal.h"

namespace pdserve::gpuemu {
namespace {
std::atomic<uint64_t> g_reuse_poisoned{0};
}  // namespace

cudaError_t PoisonReusedDevice(void* device, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!DeviceRange(device, bytes)) return SetLastError(cudaErrorInvalidValue);
  return Submit(stream, {[device, bytes] {
                  std::memset(device, kPoison, bytes);
                  g_reuse_poisoned.fetch_add(bytes, std::memory_order_relaxed);
                }});
}

cudaError_t PoisonReusedHost(void* host, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!PinnedRange(host, bytes)) return SetLastError(cudaErrorInvalidValue);
  std::memset(host, kPoison, bytes);
  g_reuse_poisoned.fetch_add(bytes, std::memory_order_relaxed);
  return cudaSuccess;
}

uint64_t ReusePoisonedBytes() { return g_reuse_poisoned.load(std::memory_order_relaxed); }

}  // namespace pdserve::gpuemu
