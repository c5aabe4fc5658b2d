// Poison for memory the CUDA runner hands out again: a step's arena, a
// decode graph's buffers, the host staging of inputs and outputs, per-layer
// attention workspaces, KV staging, and the slots of a sequence's KV blocks
// that no step has written yet (a block may come back from another
// sequence). Under the CPU emulation each call fills the memory with the
// emulation's poison (0xff bytes: NaN as f32, bf16 and f16, -1 as integers)
// at the point of reuse, so a kernel or copy that reads what the current
// use did not write reads NaN or -1 and fails a test, instead of reading
// the previous step's plausible values. Under nvcc the calls compile to
// nothing: on a GPU the memory keeps what it held.
#pragma once

#include <cstddef>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

// Whether the calls below do anything (the emulation); callers skip work
// that only feeds them (e.g. finding unwritten KV slots) when false.
#if defined(PDSERVE_GPU_EMULATION)
inline constexpr bool kPoisonsReuse = true;
#else
inline constexpr bool kPoisonsReuse = false;
#endif

// Device memory [device, device + bytes), in order on `stream`, before the
// work that reuses it (recorded into a graph when `stream` captures).
inline cudaError_t PoisonForReuse(void* device, size_t bytes, cudaStream_t stream) {
#if defined(PDSERVE_GPU_EMULATION)
  return ::pdserve::gpuemu::PoisonReusedDevice(device, bytes, stream);
#else
  (void)device;
  (void)bytes;
  (void)stream;
  return cudaSuccess;
#endif
}

// Pinned host memory that no device work still uses, at once.
inline cudaError_t PoisonHostForReuse(void* host, size_t bytes) {
#if defined(PDSERVE_GPU_EMULATION)
  return ::pdserve::gpuemu::PoisonReusedHost(host, bytes);
#else
  (void)host;
  (void)bytes;
  return cudaSuccess;
#endif
}

}  // namespace pdserve::cuda
