// What a front end knows of the model to turn a request's input into prompt
// tokens and generated tokens back into text: config.json (with
// generation_config.json), the tokenizer and the chat template. Immutable
// once loaded; shared by every request.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace pdserve::frontend {

struct PromptSource {
  engine::ModelConfig config;
  std::unique_ptr<const text::Tokenizer> tokenizer;  // never null once loaded
  // The model's chat template; nullopt: chat input is refused with
  // `chat_unavailable` as the reason.
  std::optional<text::ChatTemplate> chat_template;
  std::string chat_unavailable = "the model has no chat template";
  // Empty while text works; else why not (the tokenizer cannot be loaded):
  // text, chat and stop strings are refused with it, token ids are served,
  // and replies carry token ids without text (tokenizer is a
  // text::NoTextTokenizer).
  std::string text_unavailable;

  // Reads a Hugging Face model directory: ModelConfig::FromModelDir, then
  // LoadTokenizer, then LoadChatTemplate. A missing or unusable chat template
  // (outside the supported Jinja subset) is not an error: text and token ids
  // are still served, and chat requests get the reason. Neither is a
  // tokenizer that cannot be loaded: token ids are still served, and text
  // and chat requests get the reason (a start-up warning says so). Other
  // failures are returned.
  static absl::StatusOr<PromptSource> Load(const std::string& model_dir);
};

}  // namespace pdserve::frontend
