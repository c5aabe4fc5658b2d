// Token sampling on the device with exactly the CPU sampler's semantics
// (engine/runtime/sampler.h), so a backend swap never changes what a seed means:
//   greedy (temperature <= 0): highest logit, lowest id on ties, NaN as
//     -inf, 0 when nothing beats -inf;
//   otherwise: candidates are ids whose logit > -inf (not NaN); top-k keeps
//     the k best by (logit desc, id asc); values exp(x / T - max / T) in
//     double (with +inf logits: only they, sharing the mass equally);
//     min-p drops value < min_p (the max has value 1); top-p keeps the
//     shortest prefix in (value desc, id asc) order whose mass reaches
//     top_p * total * (1 - 1e-6); the draw is the inverse CDF of
//     UniformForStep(seed, step) (engine/runtime/sampling_draw.h) over the kept ids
//     in ascending order.
// Equal up to floating-point summation order: sums here run over other
// groupings than the CPU's, which can only matter when a draw or a top-p
// threshold falls within ~1e-16 (relative) of a boundary.
//
// One thread block per row; logits [rows, vocab] fp32 row-major; the
// pieces a request needs on the host (token ids, log-probabilities) are
// small outputs, so nothing of vocabulary size is copied back.
#pragma once

#include <cstdint>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

struct DeviceSamplingParams {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  int step = 0;  // index of the generated token being drawn
};

// tokens[r] = greedy token of row r.
cudaError_t SampleGreedy(const float* logits, int rows, int vocab, int32_t* tokens,
                         cudaStream_t stream);

// tokens[r] = the token the CPU sampler's SampleToken(row r, params[r],
// params[r].step) draws (greedy where temperature <= 0).
cudaError_t SampleTokens(const float* logits, int rows, int vocab,
                         const DeviceSamplingParams* params, int32_t* tokens, cudaStream_t stream);

// Logits processors of engine::ApplyLogitsProcessors, in place, from compact
// per-row lists the host builds (sampling_inputs.h): for row r,
//   ids tokens[offsets[r]..offsets[r+1]) are the distinct ids of prompt and
//   output (repetition penalty), counts[] their occurrences in the output
//   (presence/frequency penalties where > 0); then ids
//   mask_tokens[mask_offsets[r]..mask_offsets[r+1]) are set to -inf
//   (min_tokens: EOS and stop ids).
struct DevicePenalty {
  float repetition = 1.0f;
  float presence = 0.0f;
  float frequency = 0.0f;
};
struct PenaltyArgs {
  const DevicePenalty* params = nullptr;  // [rows]
  const int32_t* offsets = nullptr;       // [rows + 1]
  const int32_t* tokens = nullptr;
  const int32_t* counts = nullptr;
  const int32_t* mask_offsets = nullptr;  // [rows + 1]
  const int32_t* mask_tokens = nullptr;
};
cudaError_t ApplyPenalties(float* logits, int rows, int vocab, const PenaltyArgs& args,
                           cudaStream_t stream);

// Log-probabilities of the raw logits (log-softmax in double, NaN as -inf),
// as engine::Sample reports them: token_logprobs[r] of tokens[r], and the
// top_n (<= 20) most likely ids of each row, most likely first, lowest id
// on ties, in top_ids / top_logprobs [rows, top_n].
inline constexpr int kMaxTopLogprobs = 20;
cudaError_t ComputeLogprobs(const float* logits, int rows, int vocab, const int32_t* tokens,
                            int top_n, float* token_logprobs, int32_t* top_ids, float* top_logprobs,
                            cudaStream_t stream);

}  // namespace pdserve::cuda
