// Masked row softmax (see masked_softmax.cuh): one block per (head, row).
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/masked_softmax.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 128;

__global__ void MaskedSoftmaxKernel(MaskedSoftmaxArgs a) {
  const int64_t row = blockIdx.x;  // h * rows + r
  const int p = a.q_start + static_cast<int>(row % a.rows);
  const int lowest = a.sliding_window > 0 && p >= a.sliding_window ? p - a.sliding_window + 1 : 0;
  const int lo = lowest - a.k_start, hi = p - a.k_start;  // visible columns lo..hi
  const float* s = a.scores + row * a.cols;
  __nv_bfloat16* out = a.probs + row * a.cols;
  float m = -INFINITY;
  for (int c = lo + static_cast<int>(threadIdx.x); c <= hi; c += blockDim.x) m = fmaxf(m, s[c]);
  m = BlockAllReduce(m, MaxOp{}, -INFINITY);
  float sum = 0.0f;
  for (int c = lo + static_cast<int>(threadIdx.x); c <= hi; c += blockDim.x) sum += expf(s[c] - m);
  sum = BlockAllReduce(sum, SumOp{}, 0.0f);
  const float inv = 1.0f / sum;
  for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
    out[c] = __float2bfloat16(c >= lo && c <= hi ? expf(s[c] - m) * inv : 0.0f);
  }
}

}  // namespace

cudaError_t MaskedSoftmax(const MaskedSoftmaxArgs& args, cudaStream_t stream) {
  const int64_t rows = int64_t{args.heads} * args.rows;
  if (rows <= 0 || args.cols <= 0) return cudaSuccess;
  if (args.q_start < args.k_start || args.q_start + args.rows - 1 - args.k_start >= args.cols) {
    return cudaErrorInvalidValue;
  }
  return Launch(MaskedSoftmaxKernel, {static_cast<unsigned>(rows), kThreads, 0, stream}, args);
}

}  // namespace pdserve::cuda
