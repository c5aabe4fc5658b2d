// Named model shapes of the CUDA benchmark and the CUDA/CPU check
// (tests/gpu/cuda_check.cc): the configurations of public checkpoints, for
// random weights (bench/random_weights.h).
//   llama-1b    Llama-3.2-1B   (hidden 2048, 16 layers, 32/8 heads of 64,
//                               tied, llama3 rope scaling, vocab 128256)
//   llama-8b    Llama-3.1-8B   (hidden 4096, 32 layers, 32/8 heads of 128)
//   qwen3-0.6b  Qwen3-0.6B     (hidden 1024, 28 layers, 16/8 heads of 128,
//                               q/k norms, tied, vocab 151936)
//   tiny, tiny-qwen3           small Llama and Qwen3 shapes for the CPU
//                               emulation, where every GPU thread is a fiber
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/model/config.h"

namespace pdserve::bench {

// INVALID_ARGUMENT naming the known shapes for any other name.
absl::StatusOr<engine::ModelConfig> ModelShape(const std::string& name);

}  // namespace pdserve::bench
