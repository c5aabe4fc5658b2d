// Token sampling: greedy, temperature, top-k, top-p. Stateless and
// deterministic: the draw for the n-th generated token of a request depends
// only on (seed, n) and the logits, so a request gives the same tokens whether
// its first token is sampled on a prefill worker and the rest on a decode
// worker, or all in one process, and whatever else shares its batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace pdserve::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

// INVALID_ARGUMENT naming the field for out-of-range values.
absl::Status ValidateSamplingParams(const SamplingParams& params, int vocab_size);

// Samples the `step`-th generated token (0 = first) from `logits`.
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, int step);

}  // namespace pdserve::engine
