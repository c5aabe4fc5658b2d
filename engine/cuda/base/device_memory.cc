// Owned CUDA allocations (see device_memory.h).
#include "engine/cuda/base/device_memory.h"

#include "absl/strings/str_cat.h"
#include "engine/cuda/base/cuda_status.h"

namespace pdserve::cuda {

template <bool kDevice>
absl::StatusOr<CudaAllocation<kDevice>> CudaAllocation<kDevice>::Create(size_t bytes,
                                                                        absl::string_view what) {
  CudaAllocation a;
  if (bytes == 0) return a;
  const cudaError_t e = kDevice ? cudaMalloc(&a.ptr_, bytes) : cudaMallocHost(&a.ptr_, bytes);
  if (e != cudaSuccess) {
    a.ptr_ = nullptr;
    cudaGetLastError();  // returned as a status; later calls must not see it again
    return CudaStatus(e, absl::StrCat(kDevice ? "cudaMalloc" : "cudaMallocHost", " of ", bytes,
                                      " bytes for ", what));
  }
  a.bytes_ = bytes;
  return a;
}

template class CudaAllocation<true>;
template class CudaAllocation<false>;

}  // namespace pdserve::cuda
