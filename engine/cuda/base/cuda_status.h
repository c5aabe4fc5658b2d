// CUDA and cuBLAS errors as absl::Status: every call of the CUDA backend
// goes through these, so an error fails the request or the step that hit
// it, never the process.
//   cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED -> RESOURCE_EXHAUSTED
//   cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorInvalidDevice
//                                                         -> FAILED_PRECONDITION
//   anything else                                         -> INTERNAL
// The message names the call (`what`), the error's name and its text; under
// the emulation it adds which kernel, block and rule failed.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

absl::Status CudaStatus(cudaError_t error, absl::string_view what);
absl::Status CublasStatus(cublasStatus_t status, absl::string_view what);

}  // namespace pdserve::cuda

// Returns from the enclosing function (which returns absl::Status) when
// `expr` (a cudaError_t) is not cudaSuccess.
#define PDSERVE_CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                      \
    if (const cudaError_t pdserve_cuda_error_ = (expr); pdserve_cuda_error_ != cudaSuccess) \
      return ::pdserve::cuda::CudaStatus(pdserve_cuda_error_, #expr);                       \
  } while (0)

// The same for a cublasStatus_t.
#define PDSERVE_CUBLAS_RETURN_IF_ERROR(expr)                               \
  do {                                                                     \
    if (const cublasStatus_t pdserve_cublas_status_ = (expr);              \
        pdserve_cublas_status_ != CUBLAS_STATUS_SUCCESS)                   \
      return ::pdserve::cuda::CublasStatus(pdserve_cublas_status_, #expr); \
  } while (0)
