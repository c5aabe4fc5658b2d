// The runner's matrix products on cuBLAS: a row-major bf16 activation times
// the transpose of a row-major bf16 weight (torch.nn.Linear's y = x W^T),
// accumulated in fp32 (CUBLAS_COMPUTE_32F), the output in fp32 or bf16.
// In cuBLAS's column-major terms the row-major y [m, n] is y^T [n, m] =
// W [n, k] x^T, i.e. GemmEx(T, N, n, m, k) with W as a k x n column-major
// matrix (its row-major self) and x as k x m.
#pragma once

#include "absl/status/status.h"
#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

// y[m, n] = x[m, k] * w[n, k]^T on the handle's stream; y_type is
// CUDA_R_32F or CUDA_R_16BF. Row strides are the widths (k for x, n for y).
absl::Status Linear(cublasHandle_t handle, const __nv_bfloat16* x, const __nv_bfloat16* w, void* y,
                    cudaDataType y_type, int m, int n, int k);

}  // namespace pdserve::cuda
