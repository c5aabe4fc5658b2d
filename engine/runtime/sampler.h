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

namespace pdserve::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off; else drop p < min_p * p_max
  uint64_t seed = 0;
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  float repetition_penalty = 1.0f;  // 1: off; over prompt and output tokens
  float presence_penalty = 0.0f;    // over output tokens
  float frequency_penalty = 0.0f;   // per occurrence in the output
  int min_tokens = 0;               // EOS and stop ids masked before this many
  int logprobs = -1;                // -1: none; else top alternatives to return

  bool HasPenalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// The tokens a request has seen, for penalties and min_tokens.
struct TokenHistory {
  std::span<const int32_t> prompt;
  std::span<const int32_t> generated;  // output so far, before this step
};

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct SampledToken {
  int32_t token = 0;
  // Filled when params.logprobs >= 0: log-probability of `token` under the
  // model's raw distribution (log-softmax of the unprocessed logits) and the
  // params.logprobs most likely tokens, most likely first (lowest id on ties).
  float logprob = 0;
  std::vector<TopLogprob> top;
};

// INVALID_ARGUMENT naming the field for out-of-range values.
absl::Status ValidateSamplingParams(const SamplingParams& params, int vocab_size);

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
void ApplyLogitsProcessors(std::span<float> logits, const SamplingParams& params,
                           const TokenHistory& history, std::span<const int> eos_ids);

// Sets out.logprob (of out.token) and out.top (the `num_top` most likely
// tokens) from the raw `logits`, as Sample does when params.logprobs >= 0.
void FillLogprobs(std::span<const float> logits, int num_top, SampledToken& out);

// The whole pipeline for step history.generated.size(): processors, the draw,
// and the log-probabilities. `scratch` is reused across calls.
SampledToken Sample(std::span<const float> logits, const SamplingParams& params,
                    const TokenHistory& history, std::span<const int> eos_ids,
                    std::vector<float>& scratch);

}  // namespace pdserve::engine
