// Bias add in place: y[r, i] += bias[i] for i < n, rows r < rows at
// y + r * row_stride (q/k/v and o projection biases; Qwen2, attention_bias).
// y is fp32 or bf16, bias [n] bf16; computed in fp32.
#pragma once

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

cudaError_t AddBias(float* y, int rows, int n, int row_stride, const __nv_bfloat16* bias,
                    cudaStream_t stream);
cudaError_t AddBias(__nv_bfloat16* y, int rows, int n, int row_stride, const __nv_bfloat16* bias,
                    cudaStream_t stream);

}  // namespace pdserve::cuda
