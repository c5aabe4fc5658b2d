// Paged KV write (see kv_cache.cuh): one thread per (row, element).
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/kv_cache.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void WriteKvCacheKernel(const T* qkv, KvWriteArgs args) {
  const int64_t item = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (item >= int64_t{args.rows} * args.kv_size) return;
  const int64_t r = item / args.kv_size, j = item % args.kv_size;
  const int64_t slot = args.slots[r];
  if (slot < 0) return;
  const T* row = qkv + r * args.row_stride;
  args.k_cache[slot * args.kv_size + j] = __float2bfloat16(ToFloat(row[args.k_col + j]));
  args.v_cache[slot * args.kv_size + j] = __float2bfloat16(ToFloat(row[args.v_col + j]));
}

template <typename T>
cudaError_t Run(const T* qkv, const KvWriteArgs& args, cudaStream_t stream) {
  const int64_t items = int64_t{args.rows} * args.kv_size;
  if (items <= 0) return cudaSuccess;
  return Launch(WriteKvCacheKernel<T>, {BlocksFor(items, kThreads), kThreads, 0, stream}, qkv,
                args);
}

// One thread per element, grid-stride: element (t, j) of the contiguous
// arrays is element j of token first + t's slot.
template <bool kToCache>
__global__ void CopyKvKernel(KvCopyArgs a) {
  const int64_t n = int64_t{a.count} * a.kv_size;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t item = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; item < n; item += stride) {
    const int t = a.first + static_cast<int>(item / a.kv_size);
    const int64_t j = item % a.kv_size;
    const int64_t at =
        (int64_t{a.block_table[t / a.block_size]} * a.block_size + t % a.block_size) * a.kv_size +
        j;
    if (kToCache) {
      a.k_cache[at] = a.k[item];
      a.v_cache[at] = a.v[item];
    } else {
      a.k[item] = a.k_cache[at];
      a.v[item] = a.v_cache[at];
    }
  }
}

template <bool kToCache>
cudaError_t CopyKv(const KvCopyArgs& args, cudaStream_t stream) {
  const int64_t items = int64_t{args.count} * args.kv_size;
  if (items <= 0) return cudaSuccess;
  if (args.block_size <= 0 || args.first < 0) return cudaErrorInvalidValue;
  constexpr unsigned kMaxBlocks = 4096;
  const unsigned blocks =
      BlocksFor(items, kThreads) < kMaxBlocks ? BlocksFor(items, kThreads) : kMaxBlocks;
  return Launch(CopyKvKernel<kToCache>, {blocks, kThreads, 0, stream}, args);
}

}  // namespace

cudaError_t GatherKv(const KvCopyArgs& args, cudaStream_t stream) {
  return CopyKv<false>(args, stream);
}
cudaError_t ScatterKv(const KvCopyArgs& args, cudaStream_t stream) {
  return CopyKv<true>(args, stream);
}

cudaError_t WriteKvCache(const float* qkv, const KvWriteArgs& args, cudaStream_t stream) {
  return Run(qkv, args, stream);
}
cudaError_t WriteKvCache(const __nv_bfloat16* qkv, const KvWriteArgs& args, cudaStream_t stream) {
  return Run(qkv, args, stream);
}

}  // namespace pdserve::cuda
