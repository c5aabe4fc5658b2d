// Rewrites an Oniguruma-syntax pattern (a tokenizer.json "Regex") for PCRE2
// so that its Unicode classes follow the tables of unicode_tables.h (Unicode
// 15.1), as the reference Rust tokenizers' Oniguruma does, rather than PCRE2's
// own (Unicode 14 in Debian 12's PCRE2 10.42):
//   \s, \S        -> Unicode White_Space and its complement (PCRE2's \s
//                    differs: it takes U+180E);
//   \p{X}, \P{X}, \p{^X}
//                 -> the property X of unicode_properties.h, inside character
//                    classes too. Names not in the tables are left to PCRE2.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pdserve::text {

// How \p{X} is written for PCRE2.
enum class PropertyForm {
  // kEngineWithAdditions when PCRE2's Unicode tables are at least
  // unicode_tables::BaseVersion(), else kRanges.
  kAuto,
  // PCRE2's own \p{X} (a table lookup per character) plus, as explicit
  // ranges, the code points X gained since the base version. Exact where
  // PCRE2's tables are from the base version to the tables' version; a
  // newer PCRE2 adds its own newer assignments. Properties that shrink
  // (Cn, C), negated properties inside a class, White_Space and scripts
  // are written as ranges.
  kEngineWithAdditions,
  // Only explicit code point ranges: exact with any PCRE2, but PCRE2 scans a
  // class's ranges one by one (tens of times slower on non-ASCII text).
  kRanges,
  // \p{X} left as written (PCRE2's own tables): the behaviour before the
  // tables existed, for comparison in tests and benchmarks.
  kEngineOnly,
};

// The pattern for PCRE2 (UTF + UCP). INVALID_ARGUMENT for a lone trailing
// backslash, an unclosed character class or POSIX bracket.
absl::StatusOr<std::string> TranslateRegex(std::string_view pattern,
                                           PropertyForm form = PropertyForm::kAuto);

// The Unicode version the rewritten patterns' classes follow under `form`,
// e.g. "15.1.0"; for kEngineOnly, PCRE2's own.
std::string RegexUnicodeVersion(PropertyForm form = PropertyForm::kAuto);

}  // namespace pdserve::text
