#include "frontend/prompt_source.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "text/tokenizer_loader.h"

namespace pdserve::frontend {

absl::StatusOr<PromptSource> PromptSource::Load(const std::string& model_dir) {
  PromptSource source;
  absl::StatusOr<engine::ModelConfig> config = engine::ModelConfig::FromModelDir(model_dir);
  if (!config.ok()) return config.status();
  source.config = *std::move(config);
  // tokenizer.json when the model ships one, else the byte-level tokenizer.
  absl::StatusOr<std::unique_ptr<text::Tokenizer>> tokenizer = text::LoadTokenizer(model_dir);
  if (!tokenizer.ok()) {
    source.text_unavailable =
        absl::StrCat("the model's tokenizer cannot be loaded: ", tokenizer.status().message());
    source.chat_unavailable = source.text_unavailable;
    source.tokenizer = std::make_unique<text::NoTextTokenizer>(source.config.vocab_size);
    PDSERVE_LOG(WARNING) << source.text_unavailable
                         << "; serving token_ids requests only (text and chat are refused)";
    return source;
  }
  source.tokenizer = *std::move(tokenizer);
  absl::StatusOr<text::ChatTemplate> chat_template = text::LoadChatTemplate(model_dir);
  if (chat_template.ok()) {
    source.chat_template = *std::move(chat_template);
  } else if (absl::IsNotFound(chat_template.status())) {
    PDSERVE_LOG(INFO) << model_dir << " has no chat template: chat requests are refused";
  } else {
    source.chat_unavailable =
        absl::StrCat("the model's chat template is not usable: ", chat_template.status().message());
    PDSERVE_LOG(WARNING) << source.chat_unavailable;
  }
  return source;
}

}  // namespace pdserve::frontend
