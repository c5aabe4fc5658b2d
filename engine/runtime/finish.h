// When a sequence stops. Shared by the prefill worker (first token), the
// decode worker and the in-process generator so they agree exactly.
#pragma once

#include <cstdint>

#include "engine/model/config.h"
#include "engine/runtime/sampler.h"

namespace pdserve::engine {

// Values match pdserve.v1.FinishReason.
enum class FinishReason : int { kNone = 0, kLength = 1, kStop = 2, kContext = 3 };

// Whether generation ends after `token`, the `num_generated`-th generated
// token (1-based), when the sequence (prompt + generated) is `total_tokens`
// long.
inline FinishReason CheckFinish(const ModelConfig& config, const SamplingParams& params,
                                int32_t token, int num_generated, int total_tokens) {
  if (!params.ignore_eos && config.IsEos(token)) return FinishReason::kStop;
  for (int32_t stop : params.stop_token_ids) {
    if (stop == token) return FinishReason::kStop;
  }
  if (num_generated >= params.max_tokens) return FinishReason::kLength;
  if (total_tokens >= config.max_position_embeddings) return FinishReason::kContext;
  return FinishReason::kNone;
}

}  // namespace pdserve::engine
