// Unicode normalization with ICU's Normalizer2 (see normalizer.h).
#include "text/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <cstdint>

#include "absl/status/status.h"

namespace pdserve::text {
namespace {

const icu::Normalizer2* Instance(NormalizationForm form, UErrorCode* status) {
  switch (form) {
    case NormalizationForm::kNfc:
      return icu::Normalizer2::getNFCInstance(*status);
    case NormalizationForm::kNfd:
      return icu::Normalizer2::getNFDInstance(*status);
    case NormalizationForm::kNfkc:
      return icu::Normalizer2::getNFKCInstance(*status);
    case NormalizationForm::kNfkd:
      return icu::Normalizer2::getNFKDInstance(*status);
  }
  return nullptr;
}

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<Normalizer> Normalizer::Create(std::vector<NormalizationForm> forms) {
  Normalizer n;
  for (NormalizationForm form : forms) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* instance = Instance(form, &status);
    if (U_FAILURE(status) || instance == nullptr) {
      return absl::InternalError("ICU normalizer unavailable (missing ICU data?)");
    }
    n.forms_.push_back(instance);
  }
  return n;
}

std::string Normalizer::Normalize(std::string_view text) const {
  // ASCII is invariant under all four forms.
  if (forms_.empty() || IsAscii(text) || text.size() > INT32_MAX) return std::string(text);
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  for (const void* f : forms_) {
    const auto* form = static_cast<const icu::Normalizer2*>(f);
    UErrorCode status = U_ZERO_ERROR;
    // quickCheck answers YES for most text, sparing the copy.
    if (form->quickCheck(s, status) == UNORM_YES && U_SUCCESS(status)) continue;
    status = U_ZERO_ERROR;
    icu::UnicodeString normalized = form->normalize(s, status);
    if (U_SUCCESS(status)) s = std::move(normalized);
  }
  std::string out;
  s.toUTF8String(out);
  return out;
}

}  // namespace pdserve::text
