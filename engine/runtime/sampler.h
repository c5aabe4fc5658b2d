// Token sampling: logits processors (repetition, presence and frequency
// penalties; min_tokens), then greedy or temperature with top-k, min-p and
// top-p, and optional log-probabilities. Stateless and
// deterministic: the draw for the n-th generated token of a request depends
// only on (seed, n) and the logits, so a request gives the same tokens whether
// its first token is sampled on a prefill worker and the rest on a decode
// worker, or all in one process, and whatever else shares its batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/config.h"
#include "engine/types/sampling_params.h"

namespace pdserve::engine {

// The tokens a request has seen, for penalties and min_tokens.
struct TokenHistory {
  std::span<const int32_t> prompt;
  std::span<const int32_t> generated;  // output so far, before this step
};

// Checks a tokenized generation request against the model, as workers do on
// admission: a non-empty prompt of ids in [0, vocab_size), valid sampling
// parameters, and prompt + max_tokens within the context. INVALID_ARGUMENT
// naming the field.
absl::Status ValidateGenerationRequest(std::span<const int32_t> prompt,
                                       const SamplingParams& params, const ModelConfig& config);

// Samples the `step`-th generated token (0 = first) from `logits` as they
// are (no penalties): temperature, top-k, min-p, top-p.
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, int step);

// SampleToken with the uniform draw in [0, 1) given instead of taken from
// (seed, step): the same pipeline and inverse-CDF walk in ascending id order.
int32_t SampleTokenWithUniform(std::span<const float> logits, const SamplingParams& params,
                               double uniform);

// The distribution SampleToken draws from: the tokens it can return with
// their probabilities (summing to 1 up to rounding), in ascending id order.
// Greedy (temperature 0): the argmax with probability 1.
struct TokenProb {
  int32_t token = 0;
  double prob = 0;
};
void SamplingDistribution(std::span<const float> logits, const SamplingParams& params,
                          std::vector<TokenProb>& out);

// Applies the penalties and the min_tokens mask to `logits` in place.
// `eos_ids` are the model's end-of-sequence ids (masked unless ignore_eos).
// Then the constraint's mask, if any (FillConstraintMask).
void ApplyLogitsProcessors(std::span<float> logits, const SamplingParams& params,
                           const TokenHistory& history, std::span<const int> eos_ids);

// The constraint's mask for step history.generated.size() (with
// max_tokens - that many tokens left) into `mask` (TokenMaskWords(vocab)
// words). Needs params.constraint.
void FillConstraintMask(const SamplingParams& params, const TokenHistory& history,
                        std::span<const int> eos_ids, int vocab, std::vector<uint32_t>& mask);

// Sets out.logprob (of out.token) and out.top (the `num_top` most likely
// tokens) from the raw `logits`, as Sample does when params.logprobs >= 0.
void FillLogprobs(std::span<const float> logits, int num_top, SampledToken& out);

// The whole pipeline for step history.generated.size(): processors, the draw,
// and the log-probabilities. `scratch` is reused across calls.
SampledToken Sample(std::span<const float> logits, const SamplingParams& params,
                    const TokenHistory& history, std::span<const int> eos_ids,
                    std::vector<float>& scratch);

}  // namespace pdserve::engine
