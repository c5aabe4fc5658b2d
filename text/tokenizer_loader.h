// Picks and loads the tokenizer of a model directory (Hugging Face layout).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "text/tokenizer.h"

namespace pdserve::text {

// `model_dir`/tokenizer.json present: a BpeTokenizer from it, with
// tokenizer_config.json (BOS/EOS names) when that exists too; if config.json
// parses, the tokenizer's ids must fit its vocab_size (INVALID_ARGUMENT
// otherwise). No tokenizer.json: a ByteTokenizer over config.json's
// vocab_size, which must be >= 256 (FAILED_PRECONDITION otherwise). Errors
// name the file.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir);

}  // namespace pdserve::text
