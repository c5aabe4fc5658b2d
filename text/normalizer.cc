// Normalizer steps: ICU's Normalizer2 for the Unicode forms, string and regex
// replacement for Prepend / Replace (see normalizer.h).
#include "text/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

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

std::string ApplyForm(const icu::Normalizer2& form, std::string_view text) {
  // ASCII is invariant under all four forms.
  if (IsAscii(text) || text.size() > INT32_MAX) return std::string(text);
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  UErrorCode status = U_ZERO_ERROR;
  // quickCheck answers YES for most text, sparing the copy.
  if (form.quickCheck(s, status) == UNORM_YES && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  icu::UnicodeString normalized = form.normalize(s, status);
  if (U_FAILURE(status)) return std::string(text);
  std::string out;
  normalized.toUTF8String(out);
  return out;
}

}  // namespace

absl::StatusOr<Normalizer> Normalizer::Create(std::vector<NormalizerStep> steps) {
  Normalizer n;
  for (NormalizerStep& step : steps) {
    if (const auto* form = std::get_if<NormalizationForm>(&step)) {
      UErrorCode status = U_ZERO_ERROR;
      const icu::Normalizer2* instance = Instance(*form, &status);
      if (U_FAILURE(status) || instance == nullptr) {
        return absl::InternalError("ICU normalizer unavailable (missing ICU data?)");
      }
      n.steps_.emplace_back(static_cast<const void*>(instance));
    } else if (auto* prepend = std::get_if<PrependNormalizer>(&step)) {
      if (!utf8::IsValid(prepend->prefix)) {
        return absl::InvalidArgumentError("Prepend: prefix is not UTF-8");
      }
      n.steps_.emplace_back(std::move(*prepend));
    } else {
      auto& replace = std::get<ReplaceNormalizer>(step);
      if (!utf8::IsValid(replace.content)) {
        return absl::InvalidArgumentError("Replace: content is not UTF-8");
      }
      absl::StatusOr<std::unique_ptr<RegexSplitter>> pattern =
          RegexSplitter::Create(replace.pattern, /*literal=*/!replace.regex);
      if (!pattern.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("Replace: ", pattern.status().message()));
      }
      n.steps_.emplace_back(Replace{std::shared_ptr<const RegexSplitter>(*std::move(pattern)),
                                    std::move(replace.content)});
    }
  }
  return n;
}

std::string Normalizer::Normalize(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    if (const auto* form = std::get_if<const void*>(&step)) {
      s = ApplyForm(*static_cast<const icu::Normalizer2*>(*form), s);
    } else if (const auto* prepend = std::get_if<PrependNormalizer>(&step)) {
      if (!s.empty()) s.insert(0, prepend->prefix);
    } else {
      const Replace& replace = std::get<Replace>(step);
      std::string out;
      size_t prev = 0;
      for (const auto& [begin, end] : replace.pattern->FindAll(s)) {
        out.append(s, prev, begin - prev);
        out += replace.content;
        prev = end;
      }
      if (prev == 0) continue;  // no match
      out.append(s, prev, std::string::npos);
      s = std::move(out);
    }
  }
  return s;
}

}  // namespace pdserve::text
