// RoPE (see rope.cuh): one thread per (row, head, pair i).
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/rope.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void RopeKernel(T* qkv, RopeArgs args) {
  const int half = args.head_dim / 2, heads = args.q_heads + args.kv_heads;
  const int64_t item = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (item >= int64_t{args.rows} * heads * half) return;
  const int i = static_cast<int>(item % half);
  const int head = static_cast<int>(item / half % heads);
  const int row = static_cast<int>(item / (int64_t{half} * heads));
  const float angle = static_cast<float>(args.positions[row]) * args.inv_freq[i];
  const float c = static_cast<float>(cos(static_cast<double>(angle)));
  const float s = static_cast<float>(sin(static_cast<double>(angle)));
  T* x = qkv + int64_t{row} * args.row_stride + int64_t{head} * args.head_dim;
  const float a = ToFloat(x[i]), b = ToFloat(x[i + half]);
  // Products rounded before the sum, as the CPU computes them (no FMA).
  x[i] = FromFloat<T>(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
  x[i + half] = FromFloat<T>(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}

template <typename T>
cudaError_t Run(T* qkv, const RopeArgs& args, cudaStream_t stream) {
  if (args.head_dim % 2 != 0) return cudaErrorInvalidValue;
  const int64_t items = int64_t{args.rows} * (args.q_heads + args.kv_heads) * (args.head_dim / 2);
  if (items <= 0) return cudaSuccess;
  return Launch(RopeKernel<T>, {BlocksFor(items, kThreads), kThreads, 0, stream}, qkv, args);
}

}  // namespace

cudaError_t ApplyRope(float* qkv, const RopeArgs& args, cudaStream_t stream) {
  return Run(qkv, args, stream);
}
cudaError_t ApplyRope(__nv_bfloat16* qkv, const RopeArgs& args, cudaStream_t stream) {
  return Run(qkv, args, stream);
}

}  // namespace pdserve::cuda
