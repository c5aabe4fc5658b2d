// Why a sequence stopped, and the rule that decides it: shared by the prefill
// worker (first token), the decode worker, the router (a relayed stream) and
// the in-process generator so they agree exactly. Value types only
// (pdserve_engine_types): the front end and the router use them without the
// runtime.
#pragma once

#include <cstdint>

#include "engine/model/config.h"
#include "engine/types/sampling_params.h"

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
