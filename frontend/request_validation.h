// Turns a protocol-independent Request (frontend/request.h) into a checked,
// tokenized request. Every rejection is INVALID_ARGUMENT naming the offending
// field the way the client's protocol names it (Request::names), with the
// field attached (frontend/errors.h). No I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/types/sampling_params.h"
#include "frontend/prompt_source.h"
#include "frontend/request.h"

namespace pdserve::frontend {

struct ValidationOptions {
  // Largest input text in bytes: a text prompt, or the chat messages'
  // contents together and the rendered conversation. Checked before
  // tokenization, so an oversized request costs no tokenizer time. <= 0:
  // DefaultMaxPromptBytes of the model.
  int64_t max_prompt_bytes = 0;
};

// 16 bytes per position of the model's context: far more than any prompt
// that fits the context needs (tokens average 3-5 bytes of text).
int64_t DefaultMaxPromptBytes(const engine::ModelConfig& config);

struct ValidatedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;  // seed resolved
  std::vector<std::string> stop_strings;
  int priority = 0;
};

// Prompt tokens of the request's input:
//   text       tokenized as given (special tokens written in it are parsed,
//              as Hugging Face tokenizers do); BOS first where the tokenizer
//              adds one (add_bos unset), or as add_bos says (true: the
//              tokenizer's BOS, else config.json's)
//   token_ids  as given, each checked against the vocabulary
//   chat       rendered through the chat template with the generation prompt
//              (templates print their own BOS: none is added), then tokenized;
//              `now` is what strftime_now reads (templates that print the date)
// Text, chat contents and every other string must be valid UTF-8.
absl::StatusOr<std::vector<int32_t>> BuildPrompt(const Request& request, const PromptSource& source,
                                                 const ValidationOptions& options, absl::Time now);

// BuildPrompt, then the sampling parameters, stop strings and limits.
// `default_seed` is used when the request carries none.
absl::StatusOr<ValidatedRequest> ValidateRequest(const Request& request, const PromptSource& source,
                                                 const ValidationOptions& options, absl::Time now,
                                                 uint64_t default_seed);

}  // namespace pdserve::frontend
