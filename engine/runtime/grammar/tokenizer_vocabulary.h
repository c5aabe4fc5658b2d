// The vocabulary a grammar sees, from the model's tokenizer: each token's
// bytes as they join the generated text (text::Tokenizer::TokenBytes), with
// special tokens (BOS, EOS, chat markers) left out, so a grammar never
// allows them; the model's end-of-sequence ids end the output. A worker
// loads it once at start-up, only for structured output (its own input is
// token ids).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/runtime/grammar/grammar_constraint.h"
#include "engine/runtime/grammar/token_vocabulary.h"
#include "text/tokenizer.h"

namespace pdserve::engine::grammar {

// Ids [0, config.vocab_size); ids the tokenizer does not know have no bytes.
std::shared_ptr<const TokenVocabulary> VocabularyOf(const text::Tokenizer& tokenizer,
                                                    const ModelConfig& config);

// text::LoadTokenizer(model_dir), then VocabularyOf.
absl::StatusOr<std::shared_ptr<const TokenVocabulary>> LoadTokenVocabulary(
    const std::string& model_dir, const ModelConfig& config);

// What a worker serves structured output with: a compiler over
// LoadTokenVocabulary(model_dir, config).
absl::StatusOr<std::unique_ptr<GrammarCompiler>> CreateGrammarCompiler(const std::string& model_dir,
                                                                       const ModelConfig& config);

// What a worker process starts with: CreateGrammarCompiler, or, when the
// model has no tokenizer it can load, null after a warning saying why (the
// worker then refuses requests that carry a grammar).
std::unique_ptr<GrammarCompiler> WorkerGrammarCompiler(const std::string& model_dir,
                                                       const ModelConfig& config);

}  // namespace pdserve::engine::grammar
