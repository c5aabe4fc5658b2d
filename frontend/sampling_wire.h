// Converts sampling parameters and sampled-token log-probabilities between
// the internal worker protocol (pdserve.internal.v1) and the engine's
// structs. Shared by the router's orchestration (jobs out, tokens in) and
// both workers (jobs in, tokens out); its own small target
// (pdserve_sampling_wire) so workers need no tokenizer or front end.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/runtime/grammar/grammar_constraint.h"
#include "engine/types/finish_reason.h"
#include "engine/types/sampling_params.h"
#include "pdserve/internal/v1/worker.pb.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve {

engine::SamplingParams SamplingFromProto(const internal::v1::WorkerSampling& sampling);
// On the worker that samples: SamplingFromProto, with the request's grammar
// (if any) compiled by `grammars` into the constraint the sampler applies,
// and its first mask (after `generated`) computed here, on the caller's
// thread, rather than in the engine's step.
// INVALID_ARGUMENT for a grammar that does not compile; FAILED_PRECONDITION
// when the request has one and `grammars` is null (the worker could not
// load its tokenizer).
absl::StatusOr<engine::SamplingParams> SamplingForWorker(
    const internal::v1::WorkerSampling& sampling, std::span<const int32_t> generated,
    engine::grammar::GrammarCompiler* grammars);
internal::v1::WorkerSampling SamplingToProto(const engine::SamplingParams& params);
// `token` is the sampled token id; the message carries only its logprobs.
internal::v1::SampledLogprobs LogprobsToProto(const engine::SampledToken& token);
engine::SampledToken LogprobsFromProto(int32_t token,
                                       const internal::v1::SampledLogprobs& logprobs);

// A worker job's lists as they came off the wire, before they are copied:
// INVALID_ARGUMENT naming the first one over its limit (prompt and
// generated tokens together at most `context`, the model's; stop token ids
// at most engine::kMaxStopTokenIds). Workers check this first; the router
// never sends more.
absl::Status CheckJobLists(int prompt_token_ids, int generated_token_ids,
                           const internal::v1::WorkerSampling& sampling, int context);

// The wire value of a finish reason (the numbering is the same: checked at
// compile time in sampling_wire.cc).
v1::FinishReason FinishReasonToProto(engine::FinishReason reason);

}  // namespace pdserve
