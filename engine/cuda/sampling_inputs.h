// Host-side inputs of the device sampler (sampling.cuh) built from the
// engine's request state: per-row DeviceSamplingParams, and the compact
// penalty lists that mirror engine::ApplyLogitsProcessors. Plain C++; the
// caller uploads the vectors as they are.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/cuda/sampling.cuh"
#include "engine/runtime/sampler.h"

namespace pdserve::cuda {

DeviceSamplingParams ToDeviceParams(const engine::SamplingParams& params, int step);

// Whether a row needs ApplyPenalties (penalties, or min_tokens masking).
bool NeedsLogitsProcessors(const engine::SamplingParams& params,
                           const engine::TokenHistory& history);

// PenaltyArgs' arrays for a batch, one AddRow per row in order.
struct PenaltyInputs {
  std::vector<DevicePenalty> params;
  std::vector<int32_t> offsets = {0};
  std::vector<int32_t> tokens;
  std::vector<int32_t> counts;
  std::vector<int32_t> mask_offsets = {0};
  std::vector<int32_t> mask_tokens;

  // The row of a request at step history.generated.size(): the distinct ids
  // in [0, vocab) the repetition penalty touches (prompt and output) or the
  // presence/frequency penalties touch (output), with their output counts;
  // and the ids min_tokens masks (EOS unless ignore_eos, stop ids).
  void AddRow(const engine::SamplingParams& params, const engine::TokenHistory& history,
              std::span<const int> eos_ids, int vocab);
};

}  // namespace pdserve::cuda
