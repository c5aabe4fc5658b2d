// The engine's value types a request carries across processes: sampling
// parameters (with a structured-output constraint, token_constraint.h) and
// a sampled token with its log-probabilities. No engine
// code: the front end links these (pdserve_engine_types) without the runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/types/token_constraint.h"

namespace pdserve::engine {

// Most stop token ids a request may carry (each generated token is compared
// with every one): far more than any model's end tokens, and a bound on
// what one request can make every hop hold.
inline constexpr int kMaxStopTokenIds = 1024;

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
  // Structured output: the grammar the output must match, as the worker
  // protocol carries it (engine/runtime/grammar/grammar_spec.h); empty:
  // none. The worker that samples compiles it into `constraint`, which the
  // sampler applies (masked tokens are never drawn; log-probabilities stay
  // those of the raw logits). Copies share the constraint, which follows
  // whichever history it is asked about.
  std::string grammar_spec;
  std::shared_ptr<const TokenConstraint> constraint;

  bool HasPenalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
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

// INVALID_ARGUMENT naming the field for out-of-range values (and for more
// than kMaxStopTokenIds stop token ids, and for ignore_eos or min_tokens
// with structured output: the grammar decides where the output may end).
absl::Status ValidateSamplingParams(const SamplingParams& params, int vocab_size);

}  // namespace pdserve::engine
