// CUDA and cuBLAS errors as absl::Status; see cuda_status.h.
#include "engine/cuda/base/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pdserve::cuda {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
#if defined(PDSERVE_GPU_EMULATION)
  if (const std::string detail = ::pdserve::gpuemu::LastFailureMessage(); !detail.empty()) {
    absl::StrAppend(&message, " [emulation: ", detail, "]");
  }
#endif
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", cublasGetStatusName(status), " (",
                                           cublasGetStatusString(status), ")");
  return status == CUBLAS_STATUS_ALLOC_FAILED ? absl::ResourceExhaustedError(message)
                                              : absl::InternalError(message);
}

}  // namespace pdserve::cuda
