// Turns a client's GenerateRequest into a checked, tokenized request. Every
// rejection is INVALID_ARGUMENT naming the offending field. No I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/model/config.h"
#include "engine/runtime/sampler.h"
#include "text/tokenizer.h"
#include "pdserve/v1/generation.pb.h"
#include "router/prompt_source.h"

namespace pdserve::router {

struct ValidatedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;  // seed resolved
  std::vector<std::string> stop_strings;
};

// Prompt tokens of the request's input:
//   text       tokenized as given (special tokens written in it are parsed,
//              as Hugging Face tokenizers do); BOS first when add_bos is set
//              and the model has one (the tokenizer's, else config.json's)
//   token_ids  as given, each checked against the vocabulary
//   chat       rendered through the chat template with the generation prompt
//              (templates print their own BOS: none is added), then tokenized;
//              `now` is what strftime_now reads (templates that print the date)
absl::StatusOr<std::vector<int32_t>> BuildPrompt(const v1::GenerateRequest& request,
                                                 const PromptSource& source, absl::Time now);

// BuildPrompt, then the sampling parameters and limits. `default_seed` is used
// when the request carries none.
absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& request,
                                                 const PromptSource& source, absl::Time now,
                                                 uint64_t default_seed);

}  // namespace pdserve::router
