// Linear layers on cuBLAS (see linear.h).
#include "engine/cuda/linear.h"

#include "engine/cuda/base/cuda_status.h"

namespace pdserve::cuda {

absl::Status Linear(cublasHandle_t handle, const __nv_bfloat16* x, const __nv_bfloat16* w, void* y,
                    cudaDataType y_type, int m, int n, int k) {
  if (m <= 0) return absl::OkStatus();
  const float one = 1.0f, zero = 0.0f;
  PDSERVE_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w,
                                              CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero, y, y_type,
                                              n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace pdserve::cuda
