// SiLU * up (see silu_mul.cuh): one thread per output element.
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/silu_mul.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void SiluMulKernel(const T* gate_up, int rows, int inter, __nv_bfloat16* out) {
  const int64_t item = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (item >= int64_t{rows} * inter) return;
  const int64_t r = item / inter, i = item % inter;
  const float g = ToFloat(gate_up[r * 2 * inter + i]);
  const float u = ToFloat(gate_up[r * 2 * inter + inter + i]);
  out[item] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
}

template <typename T>
cudaError_t Run(const T* gate_up, int rows, int inter, __nv_bfloat16* out, cudaStream_t stream) {
  const int64_t items = int64_t{rows} * inter;
  if (items <= 0) return cudaSuccess;
  return Launch(SiluMulKernel<T>, {BlocksFor(items, kThreads), kThreads, 0, stream}, gate_up, rows,
                inter, out);
}

}  // namespace

cudaError_t SiluMul(const float* gate_up, int rows, int inter, __nv_bfloat16* out,
                    cudaStream_t stream) {
  return Run(gate_up, rows, inter, out, stream);
}
cudaError_t SiluMul(const __nv_bfloat16* gate_up, int rows, int inter, __nv_bfloat16* out,
                    cudaStream_t stream) {
  return Run(gate_up, rows, inter, out, stream);
}

}  // namespace pdserve::cuda
