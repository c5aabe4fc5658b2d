// RMSNorm kernels (see rms_norm.cuh): one block per row, a block-wide sum
// of squares in fp32, then the scaled row.
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/rms_norm.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;

// Row r of the output reads input row (row_index ? row_index[r] : r); with
// delta, the input row is first updated in place (residual add).
__global__ void RmsNormKernel(float* x, const float* delta, const int32_t* row_index,
                              const __nv_bfloat16* weight, int dim, float eps, __nv_bfloat16* out) {
  const int64_t in_row = row_index != nullptr ? row_index[blockIdx.x] : blockIdx.x;
  float* xr = x + in_row * dim;
  const float* dr = delta != nullptr ? delta + in_row * dim : nullptr;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (dr != nullptr) {
      v += dr[i];
      xr[i] = v;  // read back below by this same thread only
    }
    sum_sq += v * v;
  }
  sum_sq = BlockAllReduce(sum_sq, SumOp{}, 0.0f);
  const float scale = 1.0f / sqrtf(sum_sq / static_cast<float>(dim) + eps);
  __nv_bfloat16* yr = out + int64_t{blockIdx.x} * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    yr[i] = __float2bfloat16(xr[i] * scale * __bfloat162float(weight[i]));
  }
}

}  // namespace

cudaError_t FusedAddRmsNorm(float* residual, const float* delta, const __nv_bfloat16* weight,
                            int rows, int dim, float eps, __nv_bfloat16* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  return Launch(RmsNormKernel, {static_cast<unsigned>(rows), kThreads, 0, stream}, residual, delta,
                static_cast<const int32_t*>(nullptr), weight, dim, eps, out);
}

cudaError_t RmsNormGather(const float* x, const int32_t* row_index, const __nv_bfloat16* weight,
                          int rows, int dim, float eps, __nv_bfloat16* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  // Without delta the kernel never writes x.
  return Launch(RmsNormKernel, {static_cast<unsigned>(rows), kThreads, 0, stream},
                const_cast<float*>(x), static_cast<const float*>(nullptr), row_index, weight, dim,
                eps, out);
}

cudaError_t FusedAddRmsNormGather(float* residual, const float* delta, const int32_t* row_index,
                                  const __nv_bfloat16* weight, int rows, int dim, float eps,
                                  __nv_bfloat16* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  return Launch(RmsNormKernel, {static_cast<unsigned>(rows), kThreads, 0, stream}, residual, delta,
                row_index, weight, dim, eps, out);
}

}  // namespace pdserve::cuda
