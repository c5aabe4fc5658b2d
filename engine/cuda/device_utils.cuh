// Device-side helpers shared by the kernels of engine/cuda: bf16/fp32
// loads and stores, warp and block reductions, and the ordered key of a
// float. Block reductions need blockDim.x a multiple of 32 (<= 1024) and
// must be reached by every thread of the block (they contain barriers).
#pragma once

#include <cstdint>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
// NaN-free inputs only (callers map NaN first).
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};

// op over the 32 lanes of the warp, in every lane (a fixed butterfly: the
// same rounding on every run).
template <typename T, typename Op>
__device__ __forceinline__ T WarpAllReduce(T v, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// op over every thread's v, returned to every thread; `identity` is op's
// neutral element. Deterministic for a given block size.
template <typename T, typename Op>
__device__ T BlockAllReduce(T v, Op op, T identity) {
  __shared__ T partial[kWarpSize];
  const unsigned lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const unsigned warps = blockDim.x / kWarpSize;
  v = WarpAllReduce(v, op);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? partial[lane] : identity;
    w = WarpAllReduce(w, op);
    if (lane == 0) partial[0] = w;
  }
  __syncthreads();
  const T result = partial[0];
  __syncthreads();  // partial may be reused by the next call
  return result;
}

// Unsigned key with the order of the floats (NaN excluded), -0 == +0.
__device__ __forceinline__ uint32_t OrderedKey(float x) {
  const uint32_t bits = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

}  // namespace pdserve::cuda
