// Host-side sampler inputs (see sampling_inputs.h).
#include "engine/cuda/sampling_inputs.h"

#include <algorithm>

namespace pdserve::cuda {

DeviceSamplingParams ToDeviceParams(const engine::SamplingParams& params, int step) {
  DeviceSamplingParams d;
  d.temperature = params.temperature;
  d.top_k = params.top_k;
  d.top_p = params.top_p;
  d.min_p = params.min_p;
  d.seed = params.seed;
  d.step = step;
  return d;
}

bool NeedsLogitsProcessors(const engine::SamplingParams& params,
                           const engine::TokenHistory& history) {
  return params.HasPenalties() || static_cast<int>(history.generated.size()) < params.min_tokens;
}

void PenaltyInputs::AddRow(const engine::SamplingParams& p, const engine::TokenHistory& h,
                           std::span<const int> eos_ids, int vocab) {
  params.push_back({p.repetition_penalty, p.presence_penalty, p.frequency_penalty});
  const bool repetition = p.repetition_penalty != 1.0f;
  const bool counted = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  std::vector<int32_t> ids;
  const auto take = [&](std::span<const int32_t> part) {
    for (int32_t t : part) {
      if (t >= 0 && t < vocab) ids.push_back(t);
    }
  };
  if (repetition) take(h.prompt);
  if (repetition || counted) take(h.generated);
  std::vector<int32_t> output(h.generated.begin(), h.generated.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::sort(output.begin(), output.end());
  for (int32_t t : ids) {
    tokens.push_back(t);
    const auto [lo, hi] = std::equal_range(output.begin(), output.end(), t);
    counts.push_back(static_cast<int32_t>(hi - lo));
  }
  offsets.push_back(static_cast<int32_t>(tokens.size()));
  if (static_cast<int>(h.generated.size()) < p.min_tokens) {
    if (!p.ignore_eos) {
      for (int eos : eos_ids) mask_tokens.push_back(eos);
    }
    for (int32_t stop : p.stop_token_ids) mask_tokens.push_back(stop);
  }
  mask_offsets.push_back(static_cast<int32_t>(mask_tokens.size()));
}

}  // namespace pdserve::cuda
