// Kernel-side CUDA builtins for the CPU emulation: execution-space keywords,
// threadIdx/blockIdx/blockDim/gridDim, __syncthreads, warp intrinsics,
// atomics and the math intrinsics the kernels use.
//
// Each emulated GPU thread is a fiber; the fibers of one block run on one OS
// thread, switched only inside the synchronising builtins below, so
// `threadIdx` and friends are thread_local globals the block scheduler sets
// before it resumes a fiber (see launch.cc). Strict rules, each of which
// fails the launch (cudaErrorLaunchFailure, with a message from
// pdserve::gpuemu::LastFailureMessage()):
//   * __syncthreads must be reached by every thread of the block, from the
//     same call site; a thread that exits while others wait is an error;
//   * a warp intrinsic (shuffles, ballot/any/all, __syncwarp) must be
//     executed by every lane named in its mask, each naming the same mask
//     and the same intrinsic (stricter than CUDA: a lane of the mask that has
//     exited or does not exist is an error too), and a shuffle must read
//     from a lane of the mask;
//   * width must be a power of two <= 32.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gpu_emulation/float16.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __grid_constant__
// Static shared memory: one instance per OS thread that runs blocks, and the
// emulation runs one block at a time per OS thread, so the block's fibers
// share it. Unlike dynamic shared memory it is NOT poisoned between blocks
// (use the project's dynamic shared memory macro where that matters).
#define __shared__ static thread_local

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

// Set by the block scheduler for the fiber it resumes.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

namespace pdserve::gpuemu::detail {

enum class WarpOpKind { kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSyncWarp };

// Suspends the calling emulated thread at a warp intrinsic until every lane
// of `mask` arrives; returns the lane's result (shuffled bits, or the ballot).
uint64_t WarpOp(WarpOpKind kind, unsigned int mask, uint64_t value, int param, int width);

// The block's dynamic shared memory (the launch's shared-memory bytes,
// poisoned with 0xff before the block starts).
void* DynamicSharedMemory();

// Fails the current launch with `message` (a device-side trap).
[[noreturn]] void Trap(const char* message);

template <typename T>
uint64_t ToBits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "shuffle of an unsupported type");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace pdserve::gpuemu::detail

// Not inline: the scheduler identifies the barrier by its call site.
void __syncthreads();
inline void __syncwarp(unsigned int mask = 0xffffffffU) {
  pdserve::gpuemu::detail::WarpOp(pdserve::gpuemu::detail::WarpOpKind::kSyncWarp, mask, 0, 0, 32);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { pdserve::gpuemu::detail::Trap("__trap()"); }

template <typename T>
T __shfl_sync(unsigned int mask, T var, int src_lane, int width = warpSize) {
  using pdserve::gpuemu::detail::WarpOpKind;
  return pdserve::gpuemu::detail::FromBits<T>(pdserve::gpuemu::detail::WarpOp(
      WarpOpKind::kShflIdx, mask, pdserve::gpuemu::detail::ToBits(var), src_lane, width));
}
template <typename T>
T __shfl_up_sync(unsigned int mask, T var, unsigned int delta, int width = warpSize) {
  using pdserve::gpuemu::detail::WarpOpKind;
  return pdserve::gpuemu::detail::FromBits<T>(pdserve::gpuemu::detail::WarpOp(
      WarpOpKind::kShflUp, mask, pdserve::gpuemu::detail::ToBits(var), static_cast<int>(delta),
      width));
}
template <typename T>
T __shfl_down_sync(unsigned int mask, T var, unsigned int delta, int width = warpSize) {
  using pdserve::gpuemu::detail::WarpOpKind;
  return pdserve::gpuemu::detail::FromBits<T>(pdserve::gpuemu::detail::WarpOp(
      WarpOpKind::kShflDown, mask, pdserve::gpuemu::detail::ToBits(var), static_cast<int>(delta),
      width));
}
template <typename T>
T __shfl_xor_sync(unsigned int mask, T var, int lane_mask, int width = warpSize) {
  using pdserve::gpuemu::detail::WarpOpKind;
  return pdserve::gpuemu::detail::FromBits<T>(pdserve::gpuemu::detail::WarpOp(
      WarpOpKind::kShflXor, mask, pdserve::gpuemu::detail::ToBits(var), lane_mask, width));
}
inline unsigned int __ballot_sync(unsigned int mask, int predicate) {
  return static_cast<unsigned int>(pdserve::gpuemu::detail::WarpOp(
      pdserve::gpuemu::detail::WarpOpKind::kBallot, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned int mask, int predicate) {
  return static_cast<int>(pdserve::gpuemu::detail::WarpOp(pdserve::gpuemu::detail::WarpOpKind::kAny,
                                                          mask, predicate != 0, 0, 32));
}
inline int __all_sync(unsigned int mask, int predicate) {
  return static_cast<int>(pdserve::gpuemu::detail::WarpOp(pdserve::gpuemu::detail::WarpOpKind::kAll,
                                                          mask, predicate != 0, 0, 32));
}

// ---- atomics: the blocks of a grid may run on several OS threads ----

template <typename T>
T __pdserve_atomic_add(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_add(val);
}
inline int atomicAdd(int* address, int val) { return __pdserve_atomic_add(address, val); }
inline unsigned int atomicAdd(unsigned int* address, unsigned int val) {
  return __pdserve_atomic_add(address, val);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long val) {
  return __pdserve_atomic_add(address, val);
}
inline float atomicAdd(float* address, float val) { return __pdserve_atomic_add(address, val); }
inline double atomicAdd(double* address, double val) { return __pdserve_atomic_add(address, val); }
template <typename T>
T __pdserve_atomic_max(T* address, T val) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load();
  while (old < val && !ref.compare_exchange_weak(old, val)) {
  }
  return old;
}
template <typename T>
T __pdserve_atomic_min(T* address, T val) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load();
  while (val < old && !ref.compare_exchange_weak(old, val)) {
  }
  return old;
}
inline int atomicMax(int* address, int val) { return __pdserve_atomic_max(address, val); }
inline unsigned int atomicMax(unsigned int* address, unsigned int val) {
  return __pdserve_atomic_max(address, val);
}
inline int atomicMin(int* address, int val) { return __pdserve_atomic_min(address, val); }
inline unsigned int atomicMin(unsigned int* address, unsigned int val) {
  return __pdserve_atomic_min(address, val);
}
inline int atomicExch(int* address, int val) {
  return std::atomic_ref<int>(*address).exchange(val);
}
inline unsigned int atomicExch(unsigned int* address, unsigned int val) {
  return std::atomic_ref<unsigned int>(*address).exchange(val);
}
inline int atomicCAS(int* address, int compare, int val) {
  std::atomic_ref<int>(*address).compare_exchange_strong(compare, val);
  return compare;
}
inline unsigned int atomicCAS(unsigned int* address, unsigned int compare, unsigned int val) {
  std::atomic_ref<unsigned int>(*address).compare_exchange_strong(compare, val);
  return compare;
}
inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long val) {
  std::atomic_ref<unsigned long long>(*address).compare_exchange_strong(compare, val);
  return compare;
}

// ---- math and bit intrinsics (device-only names; <cmath> covers expf etc.) ----

inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
// Round-to-nearest arithmetic that is never contracted into an FMA.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline unsigned int __float_as_uint(float x) { return pdserve::gpuemu::detail::FloatBits(x); }
inline float __uint_as_float(unsigned int x) { return pdserve::gpuemu::detail::BitsFloat(x); }
inline int __float_as_int(float x) {
  return static_cast<int>(pdserve::gpuemu::detail::FloatBits(x));
}
inline float __int_as_float(int x) {
  return pdserve::gpuemu::detail::BitsFloat(static_cast<unsigned int>(x));
}
inline long long __double_as_longlong(double x) {
  long long v;
  std::memcpy(&v, &x, sizeof v);
  return v;
}
inline double __longlong_as_double(long long x) {
  double v;
  std::memcpy(&v, &x, sizeof v);
  return v;
}
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned int __brev(unsigned int x) {
  x = ((x >> 1) & 0x55555555U) | ((x & 0x55555555U) << 1);
  x = ((x >> 2) & 0x33333333U) | ((x & 0x33333333U) << 2);
  x = ((x >> 4) & 0x0f0f0f0fU) | ((x & 0x0f0f0f0fU) << 4);
  x = ((x >> 8) & 0x00ff00ffU) | ((x & 0x00ff00ffU) << 8);
  return (x >> 16) | (x << 16);
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
