// Emulated kernel launch: what `kernel<<<grid, block, shared_bytes,
// stream>>>(args...)` does under nvcc. Project code calls it through the
// launch helper of engine/cuda/cuda_compat.h, never directly.
//
// The launch is checked at once, as CUDA does (block and grid dimensions,
// shared memory against the device limits or the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize): cudaErrorInvalidConfiguration
// or cudaErrorInvalidValue, also returned by the next cudaGetLastError.
// The arguments are copied, and the grid runs later on the stream's thread:
// each block's threads as fibers, blocks spread over the emulation's worker
// threads. Errors inside the kernel surface at the next synchronisation.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace pdserve::gpuemu {

struct KernelLaunch {
  const void* func = nullptr;  // identifies the kernel (attributes, messages)
  dim3 grid, block;
  size_t shared_bytes = 0;
  // Runs the kernel body for the current emulated thread.
  std::function<void()> body;
};

// Validates and enqueues; see the file comment.
cudaError_t LaunchKernel(KernelLaunch launch, cudaStream_t stream);

template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel argument count mismatch");
  // Arguments converted to the parameter types once, as the real launch
  // copies them into the parameter buffer; every thread gets its own copy.
  auto params = std::make_shared<std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
  KernelLaunch launch;
  launch.func = reinterpret_cast<const void*>(kernel);
  launch.grid = grid;
  launch.block = block;
  launch.shared_bytes = shared_bytes;
  launch.body = [kernel, params] { std::apply(kernel, *params); };
  return LaunchKernel(std::move(launch), stream);
}

}  // namespace pdserve::gpuemu
