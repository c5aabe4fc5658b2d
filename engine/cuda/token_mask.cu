// Token masks (see token_mask.cuh): one block per row, one thread per id.
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/token_mask.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void TokenMaskKernel(float* logits, int vocab, const int32_t* mask_rows,
                                const uint32_t* masks) {
  const int row = mask_rows[blockIdx.x];
  if (row < 0) return;  // the whole block returns: no barrier below
  const int words = (vocab + 31) / 32;
  const uint32_t* mask = masks + int64_t{row} * words;
  float* x = logits + int64_t{blockIdx.x} * vocab;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (((mask[i >> 5] >> (i & 31)) & 1u) == 0) x[i] = -INFINITY;
  }
}

}  // namespace

cudaError_t ApplyTokenMasks(float* logits, int rows, int vocab, const int32_t* mask_rows,
                            const uint32_t* masks, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  return Launch(TokenMaskKernel, {static_cast<unsigned>(rows), kThreads, 0, stream}, logits, vocab,
                mask_rows, masks);
}

}  // namespace pdserve::cuda
