// RMSNorm over rows of the fp32 residual stream, output in bf16 (the next
// GEMM's input), as the CPU reference cpu::RmsNorm:
//   y[r, i] = x[r, i] * (1 / sqrt(mean_i(x[r, i]^2) + eps)) * weight[i]
// Layouts: x and delta [rows, dim] fp32 row-major; weight [dim] bf16;
// out [rows, dim] bf16.
#pragma once

#include <cstdint>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

// Fused residual add and norm: residual += delta (when delta is not null),
// then out = RMSNorm(residual) * weight.
cudaError_t FusedAddRmsNorm(float* residual, const float* delta, const __nv_bfloat16* weight,
                            int rows, int dim, float eps, __nv_bfloat16* out, cudaStream_t stream);

// out[i] = RMSNorm(x[row_index[i]]) * weight for i < rows (the final norm
// of the rows whose logits are wanted).
cudaError_t RmsNormGather(const float* x, const int32_t* row_index, const __nv_bfloat16* weight,
                          int rows, int dim, float eps, __nv_bfloat16* out, cudaStream_t stream);

// Both: for i < rows, residual[row_index[i]] += delta[row_index[i]], then
// out[i] = RMSNorm(residual[row_index[i]]) * weight (the last layer's
// residual add fused with the final norm of the rows that sample). Rows
// not named are left as they are; row_index must not repeat a row.
cudaError_t FusedAddRmsNormGather(float* residual, const float* delta, const int32_t* row_index,
                                  const __nv_bfloat16* weight, int rows, int dim, float eps,
                                  __nv_bfloat16* out, cudaStream_t stream);

}  // namespace pdserve::cuda
