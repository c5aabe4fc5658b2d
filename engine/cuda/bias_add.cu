// Bias add (see bias_add.cuh): one thread per element.
#include "engine/cuda/bias_add.cuh"
#include "engine/cuda/device_utils.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void AddBiasKernel(T* y, int rows, int n, int row_stride, const __nv_bfloat16* bias) {
  const int64_t item = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (item >= int64_t{rows} * n) return;
  const int64_t r = item / n, i = item % n;
  T* p = y + r * row_stride + i;
  *p = FromFloat<T>(ToFloat(*p) + __bfloat162float(bias[i]));
}

template <typename T>
cudaError_t Run(T* y, int rows, int n, int row_stride, const __nv_bfloat16* bias,
                cudaStream_t stream) {
  const int64_t items = int64_t{rows} * n;
  if (items <= 0) return cudaSuccess;
  return Launch(AddBiasKernel<T>, {BlocksFor(items, kThreads), kThreads, 0, stream}, y, rows, n,
                row_stride, bias);
}

}  // namespace

cudaError_t AddBias(float* y, int rows, int n, int row_stride, const __nv_bfloat16* bias,
                    cudaStream_t stream) {
  return Run(y, rows, n, row_stride, bias, stream);
}
cudaError_t AddBias(__nv_bfloat16* y, int rows, int n, int row_stride, const __nv_bfloat16* bias,
                    cudaStream_t stream) {
  return Run(y, rows, n, row_stride, bias, stream);
}

}  // namespace pdserve::cuda
