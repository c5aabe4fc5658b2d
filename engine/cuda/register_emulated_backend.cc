// Registers the CUDA backend, compiled against the CPU emulation
// (gpu_emulation/), as engine backend "cuda". Linked as an object file into
// test binaries and the test-only worker variants (never into shipped
// binaries): its static initializer runs before main, so
// CreateModelRunner({.backend = "cuda"}) and MeasurePeak find it.
#include "engine/cuda/cuda_backend.h"

#if !defined(PDSERVE_GPU_EMULATION)
#error "register_emulated_backend.cc is for PDSERVE_GPU_EMULATION builds only"
#endif

namespace pdserve::cuda {
namespace {

[[maybe_unused]] const bool kRegistered = [] {
  engine::RegisterBackend("cuda", CudaBackendHooks());
  return true;
}();

}  // namespace
}  // namespace pdserve::cuda
