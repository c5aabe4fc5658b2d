// Byte-level tokenizer and incremental UTF-8 detokenizer (see tokenizer.h).
// The detokenizer validates UTF-8 per RFC 3629 / Unicode Table 3-7 (no
// overlongs, no surrogates, nothing above U+10FFFF). Each maximal ill-formed
// subpart becomes one U+FFFD as soon as it is known to be bad, the way the
// WHATWG decoder does it, so every returned string is valid UTF-8.
#include "text/tokenizer.h"

namespace pdserve::text {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Sequence length announced by lead byte `b`, or 0 if `b` cannot start one.
int SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;  // continuation byte, C0/C1 (overlong), F5..FF (> U+10FFFF)
}

// Allowed range of the byte after lead `lead`; later bytes are 80..BF.
bool ValidSecond(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;  // no overlong 3-byte forms
    case 0xED:
      return b >= 0x80 && b <= 0x9F;  // no surrogates D800..DFFF
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;  // no overlong 4-byte forms
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;  // nothing above U+10FFFF
    default:
      return b >= 0x80 && b <= 0xBF;
  }
}

}  // namespace

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

std::string ByteTokenizer::TokenBytes(int32_t token) const {
  if (token < 0 || token >= 256 || token >= vocab_size_) return "";
  return std::string(1, static_cast<char>(token));
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  IncrementalDetokenizer detok(*this, skip_special_tokens);
  std::string out;
  for (int32_t id : ids) out += detok.Push(id);
  out += detok.Flush();
  return out;
}

std::string IncrementalDetokenizer::Push(int32_t token) {
  std::string bytes = tokenizer_.TokenBytes(token);
  if (bytes.empty() && !skip_special_tokens_) bytes = tokenizer_.SpecialTokenText(token);
  if (bytes.empty()) return "";
  pending_ += bytes;
  std::string out;
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t lead = static_cast<uint8_t>(pending_[i]);
    const int len = SequenceLength(lead);
    if (len == 1) {
      out.push_back(pending_[i++]);
      continue;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // Count the valid bytes of this sequence that are present.
    size_t valid = 1;
    while (valid < static_cast<size_t>(len) && i + valid < n) {
      const uint8_t b = static_cast<uint8_t>(pending_[i + valid]);
      const bool ok = valid == 1 ? ValidSecond(lead, b) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++valid;
    }
    if (valid == static_cast<size_t>(len)) {
      out.append(pending_, i, len);
      i += len;
    } else if (i + valid == n) {
      break;  // valid so far but incomplete: hold back
    } else {
      out += kReplacement;  // the bad byte starts afresh on the next round
      i += valid;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  // pending_ only ever holds one valid-but-incomplete sequence.
  std::string out = pending_.empty() ? "" : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace pdserve::text
