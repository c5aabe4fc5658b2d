// Unicode properties as Oniguruma patterns name them (\p{L}, \p{Lu},
// \p{Letter}, \p{White_Space}, \p{Han}), as code point sets at the version of
// the generated tables (unicode_tables.h, Unicode 15.1), for the regex
// rewriter (regex_translate.h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pdserve::text {

struct CodePointRange {
  char32_t first;
  char32_t last;  // inclusive
  bool operator==(const CodePointRange&) const = default;
};

// Sorted, disjoint, non-adjacent ranges within U+0000..U+10FFFF; never holds
// a surrogate (U+D800..U+DFFF: not in valid UTF-8, not writable in a
// PCRE2 UTF pattern).
using CodePointSet = std::vector<CodePointRange>;

struct UnicodeProperty {
  CodePointSet set;  // at unicode_tables::Version()
  // When non-empty, PCRE2's name for the same property ("L", "Lu", "L&"):
  // at any Unicode version from unicode_tables::BaseVersion() to Version(),
  // its table is `set` less some of `added` (the property only gained code
  // points since the base version). Empty where that does not hold (Cn and
  // C shrink as code points are assigned; PCRE2's script names mean
  // Script_Extensions, Oniguruma's mean Script) or where the set is short.
  std::string engine_name;
  // The ranges of `set` that hold a code point not in the property at the
  // base version (so PCRE2's table at any version from the base version to
  // the tables' version, plus these, is `set`).
  CodePointSet added;
};

// The property of an Oniguruma \p{name}, the name matched loosely as
// Oniguruma matches it (case, spaces, '_' and '-' ignored): General_Category
// values by short or long name (L, Letter, Lu, Uppercase_Letter, LC, ..., Cn,
// Unassigned), White_Space (also Space, WSpace), Any, Assigned, and the
// scripts Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic, Devanagari,
// Thai, Hangul, Hiragana, Katakana, Han (also by 4-letter code). nullptr for
// any other name. Thread-safe.
const UnicodeProperty* FindUnicodeProperty(std::string_view name);

// The code points of U+0000..U+10FFFF not in `set`, surrogates excluded.
CodePointSet Complement(const CodePointSet& set);

// Whether `cp` is in `set`.
bool Contains(const CodePointSet& set, char32_t cp);

// `set` written as items of a PCRE2 character class: \x{41}-\x{5a}\x{aa}...
std::string ClassItems(const CodePointSet& set);

}  // namespace pdserve::text
