// Unicode normalization of text before pre-tokenization (tokenizer.json
// "normalizer": null, NFC, NFD, NFKC, NFKD, or a Sequence of them), done with
// ICU. Text already in the target form (the common case) is returned as is
// after a quick check.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::text {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

class Normalizer {
 public:
  // An empty list normalizes nothing. INTERNAL if ICU lacks the data.
  static absl::StatusOr<Normalizer> Create(std::vector<NormalizationForm> forms);

  // Normalizes valid UTF-8 `text`, applying the forms in order.
  std::string Normalize(std::string_view text) const;
  bool empty() const { return forms_.empty(); }

 private:
  std::vector<const void*> forms_;  // const icu::Normalizer2*, owned by ICU
};

}  // namespace pdserve::text
