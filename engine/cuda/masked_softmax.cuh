// Row softmax of prefill attention scores with the causal (and sliding
// window) mask, between the two GEMMs of prefill attention:
//   probs[h, r, c] = softmax over the visible c of scores[h, r, c]
// scores [heads, rows, cols] fp32 (already scaled), probs the same shape in
// bf16 (the PV GEMM's input). Row r is the query at absolute position
// q_start + r; column c the key at k_start + c; the query at position p sees
// keys max(0, p - sliding_window + 1)..p (no window: 0..p). Masked
// columns get probability 0.
#pragma once

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

struct MaskedSoftmaxArgs {
  const float* scores = nullptr;
  __nv_bfloat16* probs = nullptr;
  int heads = 0;
  int rows = 0;
  int cols = 0;
  int q_start = 0;
  int k_start = 0;  // q_start + rows - 1 - k_start < cols
  int sliding_window = 0;
};

cudaError_t MaskedSoftmax(const MaskedSoftmaxArgs& args, cudaStream_t stream);

}  // namespace pdserve::cuda
