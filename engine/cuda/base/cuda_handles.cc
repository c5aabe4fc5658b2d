// Owned CUDA handles (see cuda_handles.h).
#include "engine/cuda/base/cuda_handles.h"

#include "engine/cuda/base/cuda_status.h"

namespace pdserve::cuda {

absl::StatusOr<UniqueStream> NewNonBlockingStream() {
  cudaStream_t s = nullptr;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return UniqueStream(s);
}

absl::StatusOr<UniqueEvent> NewEvent(unsigned int flags) {
  cudaEvent_t e = nullptr;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, flags));
  return UniqueEvent(e);
}

absl::StatusOr<UniqueCublas> NewCublas(cudaStream_t stream) {
  cublasHandle_t h = nullptr;
  PDSERVE_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
  UniqueCublas handle(h);
  PDSERVE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, stream));
  return handle;
}

}  // namespace pdserve::cuda
