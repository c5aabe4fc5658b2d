// Turns a client's GenerateRequest into a checked, tokenized request. Every
// rejection is INVALID_ARGUMENT naming the offending field. No I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve::router {

struct ValidatedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;  // seed resolved
  std::vector<std::string> stop_strings;
};

// `default_seed` is used when the request carries none.
absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& request,
                                                 const engine::ModelConfig& config,
                                                 const engine::Tokenizer& tokenizer,
                                                 uint64_t default_seed);

}  // namespace pdserve::router
