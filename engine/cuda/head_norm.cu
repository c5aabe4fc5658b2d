// Per-head q/k RMSNorm (see head_norm.cuh): one warp per (row, head).
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/head_norm.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 4;
constexpr int kMaxHeadDim = 512;

template <typename T>
__global__ void HeadRmsNormKernel(T* qkv, HeadNormArgs args) {
  const int heads = args.q_heads + args.kv_heads;
  const int64_t item = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (item >= int64_t{args.rows} * heads) return;  // the whole warp leaves
  const int row = static_cast<int>(item / heads), head = static_cast<int>(item % heads);
  const unsigned lane = threadIdx.x % kWarpSize;
  T* x = qkv + int64_t{row} * args.row_stride + int64_t{head} * args.head_dim;
  const __nv_bfloat16* weight = head < args.q_heads ? args.q_weight : args.k_weight;
  float v[kMaxHeadDim / kWarpSize];
  const int per_lane = (args.head_dim + kWarpSize - 1) / kWarpSize;
  float sum_sq = 0.0f;
  for (int j = 0; j < per_lane; ++j) {
    const int i = lane + j * kWarpSize;
    v[j] = i < args.head_dim ? ToFloat(x[i]) : 0.0f;
    sum_sq += v[j] * v[j];
  }
  sum_sq = WarpAllReduce(sum_sq, SumOp{});
  const float scale = 1.0f / sqrtf(sum_sq / static_cast<float>(args.head_dim) + args.eps);
  for (int j = 0; j < per_lane; ++j) {
    const int i = lane + j * kWarpSize;
    if (i < args.head_dim) x[i] = FromFloat<T>(v[j] * scale * __bfloat162float(weight[i]));
  }
}

template <typename T>
cudaError_t Run(T* qkv, const HeadNormArgs& args, cudaStream_t stream) {
  if (args.head_dim <= 0 || args.head_dim > kMaxHeadDim) return cudaErrorInvalidValue;
  const int64_t items = int64_t{args.rows} * (args.q_heads + args.kv_heads);
  if (items <= 0) return cudaSuccess;
  return Launch(HeadRmsNormKernel<T>,
                {BlocksFor(items, kWarpsPerBlock), kWarpsPerBlock * kWarpSize, 0, stream}, qkv,
                args);
}

}  // namespace

cudaError_t HeadRmsNorm(float* qkv, const HeadNormArgs& args, cudaStream_t stream) {
  return Run(qkv, args, stream);
}
cudaError_t HeadRmsNorm(__nv_bfloat16* qkv, const HeadNormArgs& args, cudaStream_t stream) {
  return Run(qkv, args, stream);
}

}  // namespace pdserve::cuda
