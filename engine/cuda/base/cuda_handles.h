// Owned CUDA runtime and cuBLAS handles (streams, events, graphs, cuBLAS
// contexts) as unique_ptrs whose deleters release them, and constructors
// that return statuses.
#pragma once

#include <memory>
#include <type_traits>

#include "absl/status/statusor.h"
#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

struct StreamDeleter {
  void operator()(std::remove_pointer_t<cudaStream_t>* s) const { cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(std::remove_pointer_t<cudaEvent_t>* e) const { cudaEventDestroy(e); }
};
struct GraphExecDeleter {
  void operator()(std::remove_pointer_t<cudaGraphExec_t>* g) const { cudaGraphExecDestroy(g); }
};
struct CublasDeleter {
  void operator()(std::remove_pointer_t<cublasHandle_t>* h) const { cublasDestroy(h); }
};
using UniqueStream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
using UniqueEvent = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;
using UniqueGraphExec = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDeleter>;
using UniqueCublas = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDeleter>;

// A stream not ordered with the legacy default stream.
absl::StatusOr<UniqueStream> NewNonBlockingStream();
// cudaEventCreateWithFlags(flags).
absl::StatusOr<UniqueEvent> NewEvent(unsigned int flags);
// A cuBLAS handle working on `stream`.
absl::StatusOr<UniqueCublas> NewCublas(cudaStream_t stream);

}  // namespace pdserve::cuda
