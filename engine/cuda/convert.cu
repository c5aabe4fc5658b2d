// fp32/fp16 -> bf16 conversion (see convert.cuh): a grid-stride loop.
#include "engine/cuda/convert.cuh"
#include "engine/cuda/device_utils.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

template <typename In>
__global__ void ConvertToBf16Kernel(const In* in, __nv_bfloat16* out, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = __float2bfloat16(ToFloat(in[i]));
  }
}

template <typename In>
cudaError_t Convert(const In* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const unsigned blocks = BlocksFor(n, kThreads) < kMaxBlocks ? BlocksFor(n, kThreads) : kMaxBlocks;
  return Launch(ConvertToBf16Kernel<In>, {blocks, kThreads, 0, stream}, in, out, n);
}

}  // namespace

cudaError_t ConvertF32ToBf16(const float* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
  return Convert(in, out, n, stream);
}

cudaError_t ConvertF16ToBf16(const __half* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
  return Convert(in, out, n, stream);
}

}  // namespace pdserve::cuda
