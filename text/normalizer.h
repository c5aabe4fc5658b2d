// Normalization of text before pre-tokenization: the steps of a
// tokenizer.json "normalizer" (null, NFC, NFD, NFKC, NFKD, Prepend, Replace,
// or a Sequence of them, flattened), applied in order:
//   - Unicode forms with ICU; text already in the form (the common case) is
//     kept after a quick check;
//   - Prepend: a string put before non-empty text (SentencePiece-converted
//     tokenizers prepend "▁" to every piece of text between added tokens);
//   - Replace: every match of a literal string or an Oniguruma-syntax regex
//     (non-overlapping, left to right) replaced by a string (Llama 2: " " ->
//     "▁").
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::text {

class RegexSplitter;

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

struct PrependNormalizer {
  std::string prefix;  // valid UTF-8
};

struct ReplaceNormalizer {
  std::string pattern;  // a literal string, or with `regex` an Oniguruma-syntax regex
  bool regex = false;
  std::string content;  // valid UTF-8
};

using NormalizerStep = std::variant<NormalizationForm, PrependNormalizer, ReplaceNormalizer>;

class Normalizer {
 public:
  // An empty list normalizes nothing. INTERNAL if ICU lacks the data;
  // INVALID_ARGUMENT for a Replace pattern that does not compile or is empty,
  // or strings that are not UTF-8.
  static absl::StatusOr<Normalizer> Create(std::vector<NormalizerStep> steps);

  // Normalizes valid UTF-8 `text`, applying the steps in order; the result is
  // valid UTF-8.
  std::string Normalize(std::string_view text) const;
  bool empty() const { return steps_.empty(); }

 private:
  struct Replace {
    std::shared_ptr<const RegexSplitter> pattern;
    std::string content;
  };
  // const icu::Normalizer2* (owned by ICU), a prefix, or a compiled Replace.
  using Step = std::variant<const void*, PrependNormalizer, Replace>;
  std::vector<Step> steps_;
};

}  // namespace pdserve::text
