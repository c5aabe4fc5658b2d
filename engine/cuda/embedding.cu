// Embedding gather (see embedding.cuh): one block per token.
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/embedding.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void EmbeddingGatherKernel(const __nv_bfloat16* table, int vocab, int hidden,
                                      const int32_t* tokens, float* out) {
  const int32_t token = tokens[blockIdx.x];
  float* row = out + int64_t{blockIdx.x} * hidden;
  const bool valid = token >= 0 && token < vocab;
  const __nv_bfloat16* src = table + int64_t{valid ? token : 0} * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    row[i] = valid ? __bfloat162float(src[i]) : __uint_as_float(0x7fffffffu);
  }
}

}  // namespace

cudaError_t EmbeddingGather(const __nv_bfloat16* table, int vocab, int hidden,
                            const int32_t* tokens, int num_tokens, float* out,
                            cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  return Launch(EmbeddingGatherKernel, {static_cast<unsigned>(num_tokens), kThreads, 0, stream},
                table, vocab, hidden, tokens, out);
}

}  // namespace pdserve::cuda
