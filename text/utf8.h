// Small UTF-8 helpers shared by the tokenizer pieces: decode one code point,
// append one, repair ill-formed input, and the Unicode White_Space property.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pdserve::text::utf8 {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point at `*pos` of well-formed UTF-8 `s` and advances
// `*pos` past it. On an ill-formed sequence returns kReplacementChar and
// advances past its maximal ill-formed subpart (at least one byte).
char32_t Next(std::string_view s, size_t* pos);

// Appends the UTF-8 encoding of `cp` (must be a scalar value) to `out`.
void Append(char32_t cp, std::string* out);

// True when `s` is well-formed UTF-8 (RFC 3629).
bool IsValid(std::string_view s);

// `s` with every maximal ill-formed subpart replaced by U+FFFD (the WHATWG
// decoder's rule, as IncrementalDetokenizer applies it).
std::string Repair(std::string_view s);

// Unicode White_Space property (what Rust's char::is_whitespace and
// Oniguruma's \s test): 9-D, 20, 85, A0, 1680, 2000-200A, 2028, 2029, 202F,
// 205F, 3000.
bool IsWhiteSpace(char32_t cp);

}  // namespace pdserve::text::utf8
