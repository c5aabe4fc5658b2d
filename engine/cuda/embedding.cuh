// Embedding gather: out[t, :] = float(table[tokens[t], :]) for t <
// num_tokens. table is [vocab, hidden] bf16 row-major; out [num_tokens,
// hidden] fp32 (the residual stream). An id outside [0, vocab) yields a NaN
// row (ids are validated on the host; this keeps a bad one visible).
#pragma once

#include <cstdint>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

cudaError_t EmbeddingGather(const __nv_bfloat16* table, int vocab, int hidden,
                            const int32_t* tokens, int num_tokens, float* out, cudaStream_t stream);

}  // namespace pdserve::cuda
