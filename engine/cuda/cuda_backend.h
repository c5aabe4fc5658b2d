// The CUDA backend as engine::CreateModelRunner and engine::MeasurePeak see
// it (engine/runner_factory.h, which finds it through engine/runtime/backend_registry.h): built
// into pdserve_engine in CUDA builds, registered by engine/cuda/register_emulated_backend.cc in
// test binaries that run it under the CPU emulation.
#pragma once

#include "engine/runtime/backend_registry.h"

namespace pdserve::cuda {

// create: reads the model directory as a WeightSource (tensors in their
// stored dtype) and builds a CudaModelRunner on device 0 with
// options.kv_block_size and num_kv_blocks (or as many bf16 blocks as
// kv_cache_bytes holds). measure_peak: cuda_peaks.h on device 0.
engine::BackendHooks CudaBackendHooks();

}  // namespace pdserve::cuda
