// UTF-8 helpers (see utf8.h). Validation follows Unicode Table 3-7: no
// overlongs, no surrogates, nothing above U+10FFFF.
#include "text/utf8.h"

#include <cstdint>

namespace pdserve::text::utf8 {
namespace {

// Sequence length announced by lead byte `b`, or 0 if `b` cannot start one.
int SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Allowed range of the byte after `lead`; later bytes are 80..BF.
bool ValidSecond(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;
    case 0xED:
      return b >= 0x80 && b <= 0x9F;
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;
    default:
      return b >= 0x80 && b <= 0xBF;
  }
}

}  // namespace

char32_t Next(std::string_view s, size_t* pos) {
  const size_t i = *pos;
  const uint8_t lead = static_cast<uint8_t>(s[i]);
  const int len = SequenceLength(lead);
  if (len == 1) {
    *pos = i + 1;
    return lead;
  }
  if (len == 0) {
    *pos = i + 1;
    return kReplacementChar;
  }
  char32_t cp = lead & (0xFF >> (len + 1));
  size_t k = 1;
  for (; k < static_cast<size_t>(len) && i + k < s.size(); ++k) {
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    const bool ok = k == 1 ? ValidSecond(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    cp = (cp << 6) | (b & 0x3F);
  }
  *pos = i + k;
  return k == static_cast<size_t>(len) ? cp : kReplacementChar;
}

void Append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t start = i;
    const char32_t cp = Next(s, &i);
    // A literal U+FFFD is 3 bytes; a replacement for bad input is not.
    if (cp == kReplacementChar && i - start != 3) return false;
    if (cp == kReplacementChar && s.substr(start, 3) != "\xEF\xBF\xBD") return false;
  }
  return true;
}

std::string Repair(std::string_view s) {
  if (IsValid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t cp = Next(s, &i);
    if (cp == kReplacementChar) {
      Append(cp, &out);
    } else {
      out.append(s, start, i - start);
    }
  }
  return out;
}

bool IsWhiteSpace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace pdserve::text::utf8
