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

}  // namespace

cudaError_t WriteKvCache(const float* qkv, const KvWriteArgs& args, cudaStream_t stream) {
  return Run(qkv, args, stream);
}
cudaError_t WriteKvCache(const __nv_bfloat16* qkv, const KvWriteArgs& args, cudaStream_t stream) {
  return Run(qkv, args, stream);
}

}  // namespace pdserve::cuda
