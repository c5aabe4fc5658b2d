// The one header CUDA sources of engine/cuda include for the CUDA runtime,
// bf16/f16 types, cuBLAS and the launch helper. It picks the real CUDA
// headers (nvcc builds, and host C++ linked against the real libraries) or
// the CPU emulation of gpu_emulation/ (PDSERVE_GPU_EMULATION builds, where
// the .cu files are compiled as C++).
//
// Kernels are ordinary CUDA C++: no inline PTX, no tensor-core intrinsics.
// Launch them only through pdserve::cuda::Launch, and take dynamic shared
// memory only through PDSERVE_DYNAMIC_SHARED.
#pragma once

#include <cstddef>
#include <utility>

#if defined(PDSERVE_GPU_EMULATION)
#include "gpu_emulation/cublas.h"
#include "gpu_emulation/cuda_runtime.h"
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

// `T* name` pointing at the block's dynamic shared memory (the launch's
// shared_bytes, 16-byte aligned). The emulation poisons it per block.
#if defined(PDSERVE_GPU_EMULATION)
#define PDSERVE_DYNAMIC_SHARED(T, name) \
  T* name = reinterpret_cast<T*>(::pdserve::gpuemu::detail::DynamicSharedMemory())
#else
#define PDSERVE_DYNAMIC_SHARED(T, name)                          \
  extern __shared__ __align__(16) unsigned char pdserve_smem_[]; \
  T* name = reinterpret_cast<T*>(pdserve_smem_)
#endif

namespace pdserve::cuda {

// Threads of a warp; kernels assume it.
inline constexpr int kWarpSize = 32;

struct LaunchDims {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
};

#if defined(PDSERVE_GPU_EMULATION) || defined(__CUDACC__)
// Launches `kernel` on `dims` and returns the launch's error (configuration
// errors at once; faults inside the kernel surface at a later
// synchronisation, as in CUDA). The only way project code launches kernels.
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), const LaunchDims& dims, Args&&... args) {
#if defined(PDSERVE_GPU_EMULATION)
  return ::pdserve::gpuemu::Launch(kernel, dims.grid, dims.block, dims.shared_bytes, dims.stream,
                                   std::forward<Args>(args)...);
#else
  // clang-format off
  kernel<<<dims.grid, dims.block, dims.shared_bytes, dims.stream>>>(std::forward<Args>(args)...);
  // clang-format on
  return cudaGetLastError();
#endif
}
#endif

// Blocks of `block` threads covering `n` items, one item per thread.
inline unsigned int BlocksFor(long long n, unsigned int block) {
  return static_cast<unsigned int>((n + block - 1) / block);
}

}  // namespace pdserve::cuda
