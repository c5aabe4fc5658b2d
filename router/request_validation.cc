#include "router/request_validation.h"

#include "absl/strings/str_cat.h"

namespace pdserve::router {
namespace {
constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
}  // namespace

absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& request,
                                                 const engine::ModelConfig& config,
                                                 const engine::Tokenizer& tokenizer,
                                                 uint64_t default_seed) {
  ValidatedRequest out;
  out.request_id = request.request_id();
  if (out.request_id.size() > 256) {
    return absl::InvalidArgumentError("request_id is longer than 256 bytes");
  }
  switch (request.input_case()) {
    case v1::GenerateRequest::kText:
      if (request.text().empty()) return absl::InvalidArgumentError("text is empty");
      if (request.add_bos() && config.bos_token_id >= 0) out.prompt.push_back(config.bos_token_id);
      for (int32_t t : tokenizer.Encode(request.text())) out.prompt.push_back(t);
      break;
    case v1::GenerateRequest::kTokenIds:
      if (request.token_ids().ids_size() == 0) return absl::InvalidArgumentError("token_ids is empty");
      for (int32_t t : request.token_ids().ids()) {
        if (t < 0 || t >= config.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("token_ids: ", t, " is outside [0, ", config.vocab_size, ")"));
        }
        out.prompt.push_back(t);
      }
      break;
    case v1::GenerateRequest::kChat:
      return absl::InvalidArgumentError("chat: chat requests are not served yet; send text or token_ids");
    case v1::GenerateRequest::INPUT_NOT_SET:
      return absl::InvalidArgumentError("input: set text or token_ids");
  }
  const int prompt_len = static_cast<int>(out.prompt.size());
  const int context = config.max_position_embeddings;
  if (prompt_len >= context) {
    return absl::InvalidArgumentError(absl::StrCat("input: the prompt has ", prompt_len,
                                                   " tokens; the model context is ", context));
  }

  const v1::SamplingParams& s = request.sampling();
  engine::SamplingParams& p = out.sampling;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();
  p.seed = s.has_seed() ? s.seed() : default_seed;
  p.max_tokens = s.max_tokens();
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  p.min_p = s.min_p();
  p.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.min_tokens = s.min_tokens();
  p.logprobs = s.has_logprobs() ? s.logprobs() : -1;
  if (s.has_logprobs() && s.logprobs() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.logprobs must be in [0, 20], got ", s.logprobs()));
  }
  if (s.stop_size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.stop: at most ", kMaxStopStrings, " strings, got ", s.stop_size()));
  }
  for (const std::string& stop : s.stop()) {
    if (stop.empty() || stop.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.stop: each string must be 1..", kMaxStopStringBytes, " bytes, got ", stop.size()));
    }
    out.stop_strings.push_back(stop);
  }
  if (p.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens must be >= 1, got ", p.max_tokens));
  }
  if (int64_t{prompt_len} + p.max_tokens > context) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens: prompt (", prompt_len, ") + max_tokens (", p.max_tokens,
                     ") exceeds the model context of ", context));
  }
  if (absl::Status status = engine::ValidateSamplingParams(p, config.vocab_size); !status.ok()) {
    return status;
  }
  return out;
}

}  // namespace pdserve::router
