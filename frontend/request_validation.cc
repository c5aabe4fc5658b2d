#include "frontend/request_validation.h"

#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "frontend/errors.h"
#include "frontend/request_limits.h"
#include "frontend/structured_output.h"
#include "text/utf8.h"

namespace pdserve::frontend {
namespace {

// The variables the renderer sets itself; chat_template_kwargs and adapter
// variables may not shadow them.
constexpr const char* kReservedTemplateNames[] = {
    "messages",  "add_generation_prompt", "bos_token",      "eos_token", "tools",
    "documents", "strftime_now",          "raise_exception"};

bool IsReservedTemplateName(const std::string& name) {
  for (const char* reserved : kReservedTemplateNames) {
    if (name == reserved) return true;
  }
  return false;
}

// A name chat_template_kwargs may set: an identifier of at most 64 bytes that
// is none of the variables the renderer sets itself.
bool IsTemplateKwargName(const std::string& name) {
  if (name.empty() || name.size() > 64 || std::isdigit(static_cast<unsigned char>(name[0]))) {
    return false;
  }
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return !IsReservedTemplateName(name);
}

absl::Status CheckUtf8(const std::string& value, const std::string& field) {
  if (text::utf8::IsValid(value)) return absl::OkStatus();
  return FieldError(field, " is not valid UTF-8");
}

absl::Status CheckTextSize(size_t bytes, const std::string& field, int64_t limit) {
  if (static_cast<int64_t>(bytes) <= limit) return absl::OkStatus();
  return FieldError(
      field, absl::StrCat(": ", bytes, " bytes of text; at most ", limit, " (--max_prompt_bytes)"));
}

int64_t MaxPromptBytes(const ValidationOptions& options, const engine::ModelConfig& config) {
  return options.max_prompt_bytes > 0 ? options.max_prompt_bytes : DefaultMaxPromptBytes(config);
}

absl::StatusOr<std::vector<int32_t>> BuildChatPrompt(const Request& request,
                                                     const PromptSource& source, int64_t limit,
                                                     absl::Time now) {
  const FieldNames& names = request.names;
  if (!source.chat_template.has_value()) {
    return FieldError(names.chat,
                      absl::StrCat(": ", source.chat_unavailable, "; send text or token ids"));
  }
  const std::vector<text::ChatMessage>& messages = request.chat.messages;
  if (messages.empty()) return FieldError(names.messages, " is empty");
  if (messages.size() > kMaxChatMessages) {
    return FieldError(names.messages, absl::StrCat(": at most ", kMaxChatMessages,
                                                   " messages, got ", messages.size()));
  }
  size_t content_bytes = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string field = absl::StrCat(names.messages, "[", i, "]");
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return FieldError(absl::StrCat(field, ".role"),
                        absl::StrCat(" must be system, user, assistant or tool, got \"",
                                     text::utf8::Repair(role.substr(0, 32)), "\""));
    }
    if (absl::Status s = CheckUtf8(messages[i].content, absl::StrCat(field, ".content")); !s.ok()) {
      return s;
    }
    content_bytes += messages[i].content.size();
  }
  if (absl::Status s = CheckTextSize(content_bytes, names.messages, limit); !s.ok()) return s;

  text::ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.now = now;
  if (request.chat.template_flags.size() > kMaxChatTemplateKwargs) {
    return FieldError(names.template_kwargs,
                      absl::StrCat(": at most ", kMaxChatTemplateKwargs, " entries"));
  }
  for (const auto& [name, value] : request.chat.template_flags) {
    if (!IsTemplateKwargName(name)) {
      return FieldError(
          names.template_kwargs,
          absl::StrCat(": \"", text::utf8::Repair(name.substr(0, 64)),
                       "\" is not an identifier the template may take (reserved, or not "
                       "[A-Za-z_][A-Za-z0-9_]*)"));
    }
    options.flags.emplace_back(name, value);
  }
  options.variables = request.chat.template_variables;
  absl::StatusOr<std::string> rendered = text::RenderChat(*source.chat_template, messages, options);
  if (!rendered.ok())
    return FieldError(names.chat, absl::StrCat(": ", rendered.status().message()));
  if (absl::Status s = CheckTextSize(rendered->size(), names.chat, limit); !s.ok()) return s;
  return source.tokenizer->Encode(*rendered);
}

}  // namespace

int64_t DefaultMaxPromptBytes(const engine::ModelConfig& config) {
  return int64_t{16} * std::max(config.max_position_embeddings, 1);
}

absl::StatusOr<std::vector<int32_t>> BuildPrompt(const Request& request, const PromptSource& source,
                                                 const ValidationOptions& options, absl::Time now) {
  const engine::ModelConfig& config = source.config;
  const FieldNames& names = request.names;
  const int64_t limit = MaxPromptBytes(options, config);
  std::vector<int32_t> prompt;
  switch (request.input) {
    case Request::Input::kText: {
      if (!source.text_unavailable.empty()) {
        return FieldError(names.text,
                          absl::StrCat(": ", source.text_unavailable, "; send ", names.token_ids));
      }
      if (request.text.empty()) return FieldError(names.text, " is empty");
      if (absl::Status s = CheckTextSize(request.text.size(), names.text, limit); !s.ok()) return s;
      if (absl::Status s = CheckUtf8(request.text, names.text); !s.ok()) return s;
      // Unset: as the tokenizer's files say (Hugging Face's encode), so
      // gRPC and HTTP agree; explicit true may fall back to config.json's.
      const bool add_bos = request.add_bos.value_or(source.tokenizer->add_bos_token());
      const int bos = request.add_bos.has_value()
                          ? source.tokenizer->bos_token_id().value_or(config.bos_token_id)
                          : source.tokenizer->bos_token_id().value_or(-1);
      if (add_bos && bos >= 0) prompt.push_back(bos);
      for (int32_t t : source.tokenizer->Encode(request.text)) prompt.push_back(t);
      return prompt;
    }
    case Request::Input::kTokenIds:
      if (request.token_ids.empty()) return FieldError(names.token_ids, " is empty");
      for (int32_t t : request.token_ids) {
        if (t < 0 || t >= config.vocab_size) {
          return FieldError(names.token_ids,
                            absl::StrCat(": ", t, " is outside [0, ", config.vocab_size, ")"));
        }
      }
      return request.token_ids;
    case Request::Input::kChat:
      return BuildChatPrompt(request, source, limit, now);
    case Request::Input::kNone:
      return FieldError(names.input, absl::StrCat(": set ", names.text, ", ", names.token_ids,
                                                  " or ", names.chat));
  }
  return FieldError(names.input, ": unknown kind");
}

absl::StatusOr<ValidatedRequest> ValidateRequest(const Request& request, const PromptSource& source,
                                                 const ValidationOptions& options, absl::Time now,
                                                 uint64_t default_seed) {
  const engine::ModelConfig& config = source.config;
  const FieldNames& names = request.names;
  ValidatedRequest out;
  if (request.request_id.size() > kMaxIdBytes) {
    return FieldError(names.request_id, absl::StrCat(" is longer than ", kMaxIdBytes, " bytes"));
  }
  if (absl::Status s = CheckUtf8(request.request_id, names.request_id); !s.ok()) return s;
  if (request.user.size() > kMaxIdBytes) {
    return FieldError(names.user, absl::StrCat(" is longer than ", kMaxIdBytes, " bytes"));
  }
  if (absl::Status s = CheckUtf8(request.user, names.user); !s.ok()) return s;
  out.request_id = request.request_id;
  out.priority = request.priority;

  // Stop strings first: they are cheap to check and need no tokenizer.
  if (request.stop.size() > kMaxStopStrings) {
    return FieldError(names.stop, absl::StrCat(": at most ", kMaxStopStrings, " strings, got ",
                                               request.stop.size()));
  }
  if (!request.stop.empty() && !source.text_unavailable.empty()) {
    return FieldError(names.stop,
                      absl::StrCat(": ", source.text_unavailable, "; stop on token ids instead"));
  }
  for (size_t i = 0; i < request.stop.size(); ++i) {
    const std::string& stop = request.stop[i];
    if (stop.empty() || stop.size() > kMaxStopStringBytes) {
      return FieldError(names.stop, absl::StrCat(": each string must be 1..", kMaxStopStringBytes,
                                                 " bytes, got ", stop.size()));
    }
    if (absl::Status s = CheckUtf8(stop, absl::StrCat(names.stop, "[", i, "]")); !s.ok()) return s;
    out.stop_strings.push_back(stop);
  }

  // Before the prompt is built: a list over its limit costs no tokenizer time.
  if (request.sampling.stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
    return FieldError(absl::StrCat(names.sampling_prefix, "stop_token_ids"),
                      absl::StrCat(" must hold at most ", kMaxStopTokenIds, " ids, got ",
                                   request.sampling.stop_token_ids.size()));
  }

  absl::StatusOr<std::vector<int32_t>> prompt = BuildPrompt(request, source, options, now);
  if (!prompt.ok()) return prompt.status();
  out.prompt = *std::move(prompt);
  const int prompt_len = static_cast<int>(out.prompt.size());
  const int context = config.max_position_embeddings;
  if (prompt_len >= context) {
    return FieldError(names.input, absl::StrCat(": the prompt has ", prompt_len,
                                                " tokens; the model context is ", context));
  }

  out.sampling = request.sampling;
  engine::SamplingParams& p = out.sampling;
  p.seed = request.seed.value_or(default_seed);
  if (request.max_tokens_to_context && p.max_tokens <= 0) p.max_tokens = context - prompt_len;
  if (p.max_tokens <= 0) {
    return FieldError(names.max_tokens, absl::StrCat(" must be >= 1, got ", p.max_tokens));
  }
  if (int64_t{prompt_len} + p.max_tokens > context) {
    return FieldError(names.max_tokens,
                      absl::StrCat(": prompt (", prompt_len, ") + max_tokens (", p.max_tokens,
                                   ") exceeds the model context of ", context));
  }
  if (absl::Status status = engine::ValidateSamplingParams(p, config.vocab_size); !status.ok()) {
    // The engine names its fields "sampling.<name> ..."; say them the
    // client's way.
    std::string message(status.message());
    if (absl::StartsWith(message, "sampling.")) {
      message = absl::StrCat(names.sampling_prefix, message.substr(9));
    }
    return WithField(absl::InvalidArgumentError(message), message.substr(0, message.find(' ')));
  }
  if (absl::Status s = ValidateStructuredOutput(p, names); !s.ok()) return s;
  return out;
}

}  // namespace pdserve::frontend
