// Vocabulary from the tokenizer (see tokenizer_vocabulary.h).
#include "engine/runtime/grammar/tokenizer_vocabulary.h"

#include "common/base/logging.h"
#include "text/tokenizer_loader.h"

namespace pdserve::engine::grammar {

std::shared_ptr<const TokenVocabulary> VocabularyOf(const text::Tokenizer& tokenizer,
                                                    const ModelConfig& config) {
  std::vector<std::string> bytes(config.vocab_size);
  const int known = std::min(config.vocab_size, tokenizer.vocab_size());
  for (int id = 0; id < known; ++id) {
    if (!tokenizer.IsSpecial(id)) bytes[id] = tokenizer.TokenBytes(id);
  }
  return std::make_shared<const TokenVocabulary>(std::move(bytes), config.eos_token_ids);
}

absl::StatusOr<std::shared_ptr<const TokenVocabulary>> LoadTokenVocabulary(
    const std::string& model_dir, const ModelConfig& config) {
  absl::StatusOr<std::unique_ptr<text::Tokenizer>> tokenizer = text::LoadTokenizer(model_dir);
  if (!tokenizer.ok()) return tokenizer.status();
  return VocabularyOf(**tokenizer, config);
}

absl::StatusOr<std::unique_ptr<GrammarCompiler>> CreateGrammarCompiler(const std::string& model_dir,
                                                                       const ModelConfig& config) {
  absl::StatusOr<std::shared_ptr<const TokenVocabulary>> vocab =
      LoadTokenVocabulary(model_dir, config);
  if (!vocab.ok()) return vocab.status();
  return std::make_unique<GrammarCompiler>(*std::move(vocab));
}

std::unique_ptr<GrammarCompiler> WorkerGrammarCompiler(const std::string& model_dir,
                                                       const ModelConfig& config) {
  absl::StatusOr<std::unique_ptr<GrammarCompiler>> compiler =
      CreateGrammarCompiler(model_dir, config);
  if (compiler.ok()) return *std::move(compiler);
  PDSERVE_LOG(WARNING) << "no structured output: " << compiler.status();
  return nullptr;
}

}  // namespace pdserve::engine::grammar
