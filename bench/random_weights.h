// Random bf16 weights of a model shape, made in memory on every core: the
// weights of pdserve_cuda_bench and of tests/gpu/cuda_check.cc, where the
// shapes are too large for tools/model_writer.h (one thread, Box-Muller,
// fp32 copies: minutes for an 8B model) and no checkpoint on disk is wanted.
//
// Each tensor of ModelWeightSpecs(config) is uniform with the standard
// deviations of tools/model_writer.h (1/sqrt(in_features) for projections
// and the LM head, 1 for an untied embedding and 1/sqrt(hidden) for a tied
// one, 0.5 for biases; norm weights 1 + 0.05 x a unit-variance draw), from
// SplitMix64 streams keyed by (seed, tensor, 1 Mi-element chunk): the same
// seed gives the same weights whatever the thread count. Not the writer's
// weights: a timing does not depend on the values, and the CPU/CUDA
// comparison only needs the same weights on both sides with logits of
// unit scale. Random rather than constant, since GEMMs on zeros run faster
// than on data.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/weight_source.h"

namespace pdserve::bench {

// The weights of `config` (validated as config.json would be) as a
// WeightSource over one in-memory safetensors file (bf16).
absl::StatusOr<std::unique_ptr<engine::WeightSource>> RandomBf16Weights(
    const engine::ModelConfig& config, uint64_t seed);

}  // namespace pdserve::bench
