// Converts sampling parameters between the internal wire form and the
// engine's struct. Used by the router (to build jobs) and both workers.
#pragma once

#include "engine/runtime/finish.h"
#include "engine/runtime/sampler.h"
#include "pdserve/internal/v1/worker.pb.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve {

engine::SamplingParams SamplingFromProto(const internal::v1::WorkerSampling& sampling);
internal::v1::WorkerSampling SamplingToProto(const engine::SamplingParams& params);
internal::v1::SampledLogprobs LogprobsToProto(const engine::SampledToken& token);

// The wire value of a finish reason (the numbering is the same: checked at
// compile time in sampling_convert.cc).
v1::FinishReason FinishReasonToProto(engine::FinishReason reason);

}  // namespace pdserve
