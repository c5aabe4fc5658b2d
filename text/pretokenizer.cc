// Pre-tokenization: byte-level alphabet, PCRE2 regex splitting and the Split /
// ByteLevel steps (see pretokenizer.h). Split behaviours follow Hugging Face
// tokenizers' NormalizedString::split.
#include "text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "text/split_patterns.h"
#include "text/utf8.h"

namespace pdserve::text {
namespace {

struct Alphabet {
  std::array<std::string, 256> chars;          // byte -> UTF-8 of its character
  std::array<int16_t, 0x180> code_point_byte;  // code point -> byte, -1 if none
};

const Alphabet& GetAlphabet() {
  static const Alphabet* alphabet = [] {
    auto* a = new Alphabet;
    a->code_point_byte.fill(-1);
    // Printable bytes stand for themselves; the rest map to 256, 257, ...
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      utf8::Append(cp, &a->chars[b]);
      a->code_point_byte[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return *alphabet;
}

}  // namespace

const std::string& ByteLevelAlphabet::Char(uint8_t b) { return GetAlphabet().chars[b]; }

std::string ByteLevelAlphabet::Encode(std::string_view bytes) {
  const Alphabet& a = GetAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += a.chars[static_cast<uint8_t>(c)];
  return out;
}

std::optional<std::string> ByteLevelAlphabet::Decode(std::string_view s) {
  const Alphabet& a = GetAlphabet();
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t cp = utf8::Next(s, &i);
    if (cp == utf8::kReplacementChar && s.substr(start, i - start) != "\xEF\xBF\xBD") {
      return std::nullopt;
    }
    if (cp >= a.code_point_byte.size() || a.code_point_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(a.code_point_byte[cp]));
  }
  return out;
}

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

RegexSplitter::~RegexSplitter() = default;

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(std::string_view pattern,
                                                                     bool literal,
                                                                     PropertyForm form) {
  std::string translated;
  if (literal) {
    translated = std::string(pattern);
  } else {
    absl::StatusOr<std::string> t = TranslateRegex(pattern, form);
    if (!t.ok()) return t.status();
    translated = *std::move(t);
  }
  if (translated.empty()) return absl::InvalidArgumentError("empty split pattern");
  if (!utf8::IsValid(translated)) return absl::InvalidArgumentError("split pattern is not UTF-8");
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL admits PCRE2_UTF but not PCRE2_UCP.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex does not compile at offset ", offset,
                                                   ": ", reinterpret_cast<char*>(message)));
  }
  std::unique_ptr<RegexSplitter> splitter(new RegexSplitter);
  splitter->impl_ = std::make_unique<Impl>();
  splitter->impl_->code = code;
  // JIT is an optimisation: without it (unsupported CPU) the interpreter runs.
  splitter->impl_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return splitter;
}

bool RegexSplitter::jit() const { return impl_->jit; }

std::vector<std::pair<size_t, size_t>> RegexSplitter::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (data == nullptr) return matches;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    // The text was validated once: skip PCRE2's UTF check on every call.
    int rc =
        pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The interpreter keeps its backtracking frames on the heap.
      rc = pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       data, nullptr);
    }
    if (rc < 0) break;  // no match, or a limit hit: leave the rest unmatched
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one character.
      if (begin >= text.size()) break;
      size_t next = begin;
      utf8::Next(text, &next);
      start = next;
    }
  }
  pcre2_match_data_free(data);
  return matches;
}

namespace {

using Range = std::pair<size_t, size_t>;

// Hugging Face's NormalizedString::split: `pieces` cover `[0, n)` in order,
// each flagged as a match; returns the resulting ranges (non-empty).
std::vector<Range> ApplyBehavior(const std::vector<std::pair<Range, bool>>& pieces,
                                 SplitBehavior behavior) {
  std::vector<Range> out;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [r, m] : pieces) out.push_back(r);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& [r, m] : pieces) {
        if (!m) out.push_back(r);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& [r, m] : pieces) {
        if (m && !previous_match && !out.empty()) {
          out.back().second = r.second;
        } else {
          out.push_back(r);
        }
        previous_match = m;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        const auto& [r, m] = *it;
        if (m && !previous_match && !out.empty()) {
          out.back().first = r.first;
        } else {
          out.push_back(r);
        }
        previous_match = m;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& [r, m] : pieces) {
        if (m == previous_match && !out.empty()) {
          out.back().second = r.second;
        } else {
          out.push_back(r);
        }
        previous_match = m;
      }
      break;
    }
  }
  std::erase_if(out, [](const Range& r) { return r.first == r.second; });
  return out;
}

// Splits `text` by `regex` into pieces flagged as match / gap.
std::vector<std::pair<Range, bool>> MatchPieces(const RegexSplitter& regex, std::string_view text,
                                                bool invert) {
  std::vector<std::pair<Range, bool>> pieces;
  size_t prev = 0;
  for (const auto& [b, e] : regex.FindAll(text)) {
    if (prev != b) pieces.push_back({{prev, b}, invert});
    pieces.push_back({{b, e}, !invert});
    prev = e;
  }
  if (prev != text.size()) pieces.push_back({{prev, text.size()}, invert});
  return pieces;
}

}  // namespace

absl::StatusOr<PreTokenizer> PreTokenizer::Create(std::vector<PreTokenizerStep> steps) {
  PreTokenizer p;
  for (const PreTokenizerStep& step : steps) {
    if (const auto* split = std::get_if<SplitStep>(&step)) {
      if (split->pattern == nullptr)
        return absl::InvalidArgumentError("Split step without pattern");
    } else if (const auto* meta = std::get_if<MetaspaceStep>(&step)) {
      size_t end = 0;
      if (meta->replacement.empty() || !utf8::IsValid(meta->replacement) ||
          (utf8::Next(meta->replacement, &end), end != meta->replacement.size())) {
        return absl::InvalidArgumentError("Metaspace replacement must be one character");
      }
    } else if (std::get<ByteLevelStep>(step).use_regex && p.gpt2_ == nullptr) {
      absl::StatusOr<std::unique_ptr<RegexSplitter>> gpt2 =
          RegexSplitter::Create(split_patterns::kGpt2);
      if (!gpt2.ok()) return gpt2.status();
      p.gpt2_ = *std::move(gpt2);
    }
  }
  p.steps_ = std::move(steps);
  return p;
}

bool PreTokenizer::has_byte_level() const {
  for (const PreTokenizerStep& step : steps_) {
    if (std::holds_alternative<ByteLevelStep>(step)) return true;
  }
  return false;
}

namespace {

// A word being split, and whether it starts the original text.
struct Word {
  std::string text;
  bool starts_text;
};

// Appends the pieces `ranges` of `word` to `out`; only a piece at offset 0 of
// a word that starts the text starts it too.
void AppendPieces(const Word& word, const std::vector<Range>& ranges, std::vector<Word>* out) {
  for (const auto& [b, e] : ranges) {
    out->push_back({word.text.substr(b, e - b), word.starts_text && b == 0});
  }
}

// The Metaspace step on one word.
void Metaspace(const MetaspaceStep& step, Word word, std::vector<Word>* out) {
  std::string replaced;
  for (char c : word.text) {
    if (c == ' ') {
      replaced += step.replacement;
    } else {
      replaced.push_back(c);
    }
  }
  const bool prepend = step.prepend_scheme == PrependScheme::kAlways ||
                       (step.prepend_scheme == PrependScheme::kFirst && word.starts_text);
  if (prepend && !replaced.starts_with(step.replacement)) replaced.insert(0, step.replacement);
  word.text = std::move(replaced);
  if (!step.split) {
    out->push_back(std::move(word));
    return;
  }
  std::vector<std::pair<Range, bool>> pieces;
  size_t prev = 0;
  const size_t n = step.replacement.size();
  for (size_t pos = word.text.find(step.replacement); pos != std::string::npos;
       pos = word.text.find(step.replacement, pos + n)) {
    if (prev != pos) pieces.push_back({{prev, pos}, false});
    pieces.push_back({{pos, pos + n}, true});
    prev = pos + n;
  }
  if (prev != word.text.size()) pieces.push_back({{prev, word.text.size()}, false});
  AppendPieces(word, ApplyBehavior(pieces, SplitBehavior::kMergedWithNext), out);
}

}  // namespace

std::vector<std::string> PreTokenizer::Split(std::string_view text, bool starts_text) const {
  std::vector<std::string> result;
  if (text.empty()) return result;
  std::vector<Word> words = {{std::string(text), starts_text}};
  for (const PreTokenizerStep& step : steps_) {
    std::vector<Word> next;
    next.reserve(words.size());
    for (Word& word : words) {
      if (const auto* split = std::get_if<SplitStep>(&step)) {
        AppendPieces(
            word,
            ApplyBehavior(MatchPieces(*split->pattern, word.text, split->invert), split->behavior),
            &next);
        continue;
      }
      if (const auto* meta = std::get_if<MetaspaceStep>(&step)) {
        Metaspace(*meta, std::move(word), &next);
        continue;
      }
      const ByteLevelStep& bl = std::get<ByteLevelStep>(step);
      if (bl.add_prefix_space && word.text.front() != ' ') word.text.insert(word.text.begin(), ' ');
      if (!bl.use_regex) {
        next.push_back(std::move(word));
        continue;
      }
      AppendPieces(word,
                   ApplyBehavior(MatchPieces(*gpt2_, word.text, false), SplitBehavior::kIsolated),
                   &next);
    }
    words = std::move(next);
  }
  result.reserve(words.size());
  for (Word& word : words) result.push_back(std::move(word.text));
  return result;
}

}  // namespace pdserve::text
