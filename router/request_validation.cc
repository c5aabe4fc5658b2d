#include "router/request_validation.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace pdserve::router {
namespace {
constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr int kMaxChatMessages = 1024;
constexpr int kMaxChatTemplateKwargs = 16;

// A name chat_template_kwargs may set: an identifier of at most 64 bytes that
// is none of the variables the renderer sets itself.
bool IsTemplateKwargName(const std::string& name) {
  if (name.empty() || name.size() > 64 || std::isdigit(static_cast<unsigned char>(name[0]))) {
    return false;
  }
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  for (const char* reserved : {"messages", "add_generation_prompt", "bos_token", "eos_token",
                               "tools", "documents", "strftime_now", "raise_exception"}) {
    if (name == reserved) return false;
  }
  return true;
}
}  // namespace

absl::StatusOr<std::vector<int32_t>> BuildPrompt(const v1::GenerateRequest& request,
                                                 const PromptSource& source, absl::Time now) {
  const engine::ModelConfig& config = source.config;
  const text::Tokenizer& tokenizer = *source.tokenizer;
  std::vector<int32_t> prompt;
  switch (request.input_case()) {
    case v1::GenerateRequest::kText: {
      if (!source.text_unavailable.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("text: ", source.text_unavailable, "; send token_ids"));
      }
      if (request.text().empty()) return absl::InvalidArgumentError("text is empty");
      const int bos = tokenizer.bos_token_id().value_or(config.bos_token_id);
      if (request.add_bos() && bos >= 0) prompt.push_back(bos);
      for (int32_t t : tokenizer.Encode(request.text())) prompt.push_back(t);
      return prompt;
    }
    case v1::GenerateRequest::kTokenIds:
      if (request.token_ids().ids_size() == 0)
        return absl::InvalidArgumentError("token_ids is empty");
      for (int32_t t : request.token_ids().ids()) {
        if (t < 0 || t >= config.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("token_ids: ", t, " is outside [0, ", config.vocab_size, ")"));
        }
        prompt.push_back(t);
      }
      return prompt;
    case v1::GenerateRequest::kChat: {
      if (!source.chat_template.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat: ", source.chat_unavailable, "; send text or token_ids"));
      }
      const auto& messages = request.chat().messages();
      if (messages.empty()) return absl::InvalidArgumentError("chat.messages is empty");
      if (messages.size() > kMaxChatMessages) {
        return absl::InvalidArgumentError(absl::StrCat("chat.messages: at most ", kMaxChatMessages,
                                                       " messages, got ", messages.size()));
      }
      std::vector<text::ChatMessage> conversation;
      for (int i = 0; i < messages.size(); ++i) {
        const std::string& role = messages[i].role();
        if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
          return absl::InvalidArgumentError(absl::StrCat(
              "chat.messages[", i, "].role must be system, user, assistant or tool, got \"",
              role.substr(0, 32), "\""));
        }
        conversation.push_back({role, messages[i].content()});
      }
      text::ChatRenderOptions options;
      options.add_generation_prompt = true;
      options.now = now;
      if (request.chat().chat_template_kwargs_size() > kMaxChatTemplateKwargs) {
        return absl::InvalidArgumentError(absl::StrCat("chat.chat_template_kwargs: at most ",
                                                       kMaxChatTemplateKwargs, " entries"));
      }
      for (const auto& [name, value] : request.chat().chat_template_kwargs()) {
        if (!IsTemplateKwargName(name)) {
          return absl::InvalidArgumentError(
              absl::StrCat("chat.chat_template_kwargs: \"", name.substr(0, 64),
                           "\" is not an identifier the template may take (reserved, or not "
                           "[A-Za-z_][A-Za-z0-9_]*)"));
        }
        options.flags.emplace_back(name, value);
      }
      absl::StatusOr<std::string> text =
          text::RenderChat(*source.chat_template, conversation, options);
      if (!text.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("chat: ", text.status().message()));
      }
      return tokenizer.Encode(*text);
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      return absl::InvalidArgumentError("input: set text, token_ids or chat");
  }
  return absl::InvalidArgumentError("input: unknown kind");
}

absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& request,
                                                 const PromptSource& source, absl::Time now,
                                                 uint64_t default_seed) {
  const engine::ModelConfig& config = source.config;
  ValidatedRequest out;
  out.request_id = request.request_id();
  if (out.request_id.size() > 256) {
    return absl::InvalidArgumentError("request_id is longer than 256 bytes");
  }
  absl::StatusOr<std::vector<int32_t>> prompt = BuildPrompt(request, source, now);
  if (!prompt.ok()) return prompt.status();
  out.prompt = *std::move(prompt);
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
  if (s.stop_size() > 0 && !source.text_unavailable.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.stop: ", source.text_unavailable, "; use stop_token_ids"));
  }
  for (const std::string& stop : s.stop()) {
    if (stop.empty() || stop.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop: each string must be 1..",
                                                     kMaxStopStringBytes, " bytes, got ",
                                                     stop.size()));
    }
    out.stop_strings.push_back(stop);
  }
  if (p.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens must be >= 1, got ", p.max_tokens));
  }
  if (int64_t{prompt_len} + p.max_tokens > context) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_tokens: prompt (", prompt_len,
                                                   ") + max_tokens (", p.max_tokens,
                                                   ") exceeds the model context of ", context));
  }
  if (absl::Status status = engine::ValidateSamplingParams(p, config.vocab_size); !status.ok()) {
    return status;
  }
  return out;
}

}  // namespace pdserve::router
