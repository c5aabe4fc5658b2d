// Pre-tokenization (Hugging Face tokenizers semantics): split normalized text
// into words by regex (Split), the GPT-2 rules (ByteLevel) or SentencePiece's
// spaces (Metaspace), and the byte-level alphabet that maps bytes to the
// printable characters byte-level vocabularies are written in ("Ġ" is the
// space byte).
//
// Regexes are Oniguruma-syntax patterns from tokenizer.json, rewritten by
// TranslateRegex (regex_translate.h: \s and \p{...} follow the Unicode 15.1
// tables, as the reference Rust tokenizers' Oniguruma does), compiled with
// PCRE2 (UTF + UCP) and JIT once.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "text/regex_translate.h"

namespace pdserve::text {

// GPT-2 bytes_to_unicode: byte b <-> one printable character.
class ByteLevelAlphabet {
 public:
  // UTF-8 of the character standing for byte `b`.
  static const std::string& Char(uint8_t b);
  // `bytes` written in the alphabet.
  static std::string Encode(std::string_view bytes);
  // Raw bytes of alphabet text `s`; nullopt if a character of `s` is not in
  // the alphabet (or `s` is not valid UTF-8).
  static std::optional<std::string> Decode(std::string_view s);
};

// A compiled split pattern. Thread-safe: matching allocates per call.
class RegexSplitter {
 public:
  // `pattern` is an Oniguruma-syntax regex (a tokenizer.json "Regex"), or,
  // with `literal`, a plain string to find (a "String" pattern). `form`:
  // how its Unicode properties reach PCRE2 (regex_translate.h).
  // INVALID_ARGUMENT when it does not compile.
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Create(
      std::string_view pattern, bool literal = false, PropertyForm form = PropertyForm::kAuto);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Byte ranges [begin, end) of the successive non-empty, non-overlapping
  // matches in valid UTF-8 `text`. If the regex engine gives up (match or
  // stack limit), the rest of the text is left unmatched.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

  // Whether PCRE2 JIT-compiled the pattern (else its interpreter runs).
  bool jit() const;

 private:
  RegexSplitter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// How a Split step treats the matches (tokenizer.json "behavior").
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::shared_ptr<const RegexSplitter> pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;  // split on what does NOT match
};

// ByteLevel pre-tokenizer step. Mapping to the byte-level alphabet happens
// in the BPE model, which works on raw bytes.
struct ByteLevelStep {
  bool add_prefix_space = false;  // prepend " " to a piece that lacks one
  bool use_regex = true;          // split with the GPT-2 regex
};

// Where Metaspace puts a replacement character before a piece that lacks one.
enum class PrependScheme {
  kAlways,  // before every piece
  kFirst,   // only before the piece that starts the text (not after an added token)
  kNever,
};

// Metaspace pre-tokenizer step: spaces become `replacement` ("▁"), which is
// prepended as `prepend_scheme` says; with `split`, the piece is then cut
// before every replacement character (each word keeps its leading "▁").
struct MetaspaceStep {
  std::string replacement = "\u2581";  // one character
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;
};

using PreTokenizerStep = std::variant<SplitStep, ByteLevelStep, MetaspaceStep>;

// A sequence of steps; each refines every piece the previous ones produced.
class PreTokenizer {
 public:
  // Fails if a regex (the GPT-2 one for ByteLevel) does not compile, or a
  // Metaspace replacement is not one UTF-8 character.
  static absl::StatusOr<PreTokenizer> Create(std::vector<PreTokenizerStep> steps);

  // Splits valid UTF-8 `text` into non-empty words (byte strings; a prefix
  // space or "▁" may make a word not a substring of `text`).
  // `starts_text`: `text` begins the original input (it does not follow an
  // added token), which is where PrependScheme::kFirst prepends.
  std::vector<std::string> Split(std::string_view text, bool starts_text = true) const;

  bool has_byte_level() const;

 private:
  std::vector<PreTokenizerStep> steps_;
  std::shared_ptr<const RegexSplitter> gpt2_;  // set when a ByteLevel step uses it
};

}  // namespace pdserve::text
