// In-process reference generation: one prompt, prefill then decode on one
// ModelRunner, with the same sampling (SampleToken) and stopping
// (CheckFinish) rules as the prefill and decode workers. Disaggregated runs
// are checked against it token for token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/finish.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sampler.h"

namespace pdserve::engine {

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated tokens, the prompt excluded
  // Per token (logprob fields filled when params.logprobs >= 0).
  std::vector<SampledToken> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
};

// Generates from `prompt` with `params`. Treats the runner's whole KV cache as
// its own (blocks are handed out by a private KvCacheManager), so it must not
// run while the runner serves other sequences.
// INVALID_ARGUMENT for an empty prompt, bad tokens or sampling parameters,
// prompt.size() + max_tokens > max_position_embeddings, or a KV cache too
// small for prompt.size() + max_tokens - 1 tokens.
absl::StatusOr<GenerateResult> GenerateLocally(ModelRunner& runner, std::span<const int32_t> prompt,
                                               const SamplingParams& params);

}  // namespace pdserve::engine
