// ValidateSamplingParams: see sampling_params.h.
#include "engine/types/sampling_params.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pdserve::engine {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view range, auto value) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampling.", field, " must be in ", range, ", got ", value));
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& params, int vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size must be > 0, got ", vocab_size));
  }
  if (!(params.temperature >= 0.0f && params.temperature <= 100.0f)) {  // catches NaN
    return FieldError("temperature", "[0, 100]", params.temperature);
  }
  if (params.top_k < 0 || params.top_k > vocab_size) {
    return FieldError("top_k", absl::StrCat("[0, ", vocab_size, "]"), params.top_k);
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {  // catches NaN
    return FieldError("top_p", "(0, 1]", params.top_p);
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f))
    return FieldError("min_p", "[0, 1]", params.min_p);
  if (!(params.repetition_penalty > 0.0f && params.repetition_penalty <= 10.0f)) {
    return FieldError("repetition_penalty", "(0, 10]", params.repetition_penalty);
  }
  if (!(params.presence_penalty >= -2.0f && params.presence_penalty <= 2.0f)) {
    return FieldError("presence_penalty", "[-2, 2]", params.presence_penalty);
  }
  if (!(params.frequency_penalty >= -2.0f && params.frequency_penalty <= 2.0f)) {
    return FieldError("frequency_penalty", "[-2, 2]", params.frequency_penalty);
  }
  if (params.logprobs < -1 || params.logprobs > 20) {
    return FieldError("logprobs", "[0, 20]", params.logprobs);
  }
  if (params.min_tokens < 0 || params.min_tokens > params.max_tokens) {
    return FieldError("min_tokens", absl::StrCat("[0, max_tokens=", params.max_tokens, "]"),
                      params.min_tokens);
  }
  if (params.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens must be >= 1, got ", params.max_tokens));
  }
  if (params.stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop_token_ids must hold at most ",
                                                   kMaxStopTokenIds, " ids, got ",
                                                   params.stop_token_ids.size()));
  }
  for (int32_t id : params.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return FieldError("stop_token_ids", absl::StrCat("[0, ", vocab_size, ")"), id);
    }
  }
  if (!params.grammar_spec.empty() || params.constraint != nullptr) {
    // The grammar decides where the output may end.
    if (params.ignore_eos) {
      return absl::InvalidArgumentError(
          "sampling.ignore_eos cannot be combined with structured output");
    }
    if (params.min_tokens > 0) {
      return absl::InvalidArgumentError(
          "sampling.min_tokens cannot be combined with structured output");
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve::engine
