// Decoder chains (see decoder.h). Each step maps the list of token strings to
// a new list, as decode_chain does in the Rust `tokenizers` library.
#include "text/decoder.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace pdserve::text {
namespace {

bool IsOneCharacter(std::string_view s) {
  size_t end = 0;
  if (s.empty() || !utf8::IsValid(s)) return false;
  utf8::Next(s, &end);
  return end == s.size();
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a "<0xNN>" token, or -1.
int FallbackByte(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return -1;
  const int hi = HexDigit(token[3]), lo = HexDigit(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void Strip(const StripDecoder& step, std::string* token) {
  const std::string_view c = step.content;
  size_t begin = 0;
  for (int i = 0; i < step.start && std::string_view(*token).substr(begin).starts_with(c); ++i) {
    begin += c.size();
  }
  size_t end = token->size();
  for (int i = 0; i < step.stop && end >= begin + c.size() &&
                  std::string_view(*token).substr(0, end).ends_with(c);
       ++i) {
    end -= c.size();
  }
  *token = token->substr(begin, end - begin);
}

}  // namespace

absl::StatusOr<Decoder> Decoder::Create(std::vector<DecoderStep> steps) {
  for (const DecoderStep& step : steps) {
    if (const auto* replace = std::get_if<ReplaceDecoder>(&step)) {
      if (replace->pattern.empty()) return absl::InvalidArgumentError("Replace: empty pattern");
    } else if (const auto* strip = std::get_if<StripDecoder>(&step)) {
      if (!IsOneCharacter(strip->content) || strip->start < 0 || strip->stop < 0) {
        return absl::InvalidArgumentError("Strip needs one content character and start, stop >= 0");
      }
    } else if (const auto* meta = std::get_if<MetaspaceDecoder>(&step)) {
      if (!IsOneCharacter(meta->replacement)) {
        return absl::InvalidArgumentError("Metaspace replacement must be one character");
      }
    }
  }
  Decoder d;
  d.steps_ = std::move(steps);
  return d;
}

std::vector<std::string> Decoder::Run(std::vector<std::string> tokens, bool inside) const {
  bool fused = false;
  for (const DecoderStep& step : steps_) {
    if (const auto* replace = std::get_if<ReplaceDecoder>(&step)) {
      for (std::string& t : tokens) {
        if (t.find(replace->pattern) != std::string::npos) {
          t = absl::StrReplaceAll(t, {{replace->pattern, replace->content}});
        }
      }
    } else if (std::holds_alternative<ByteFallbackDecoder>(step)) {
      // Runs of byte tokens become one string of their bytes.
      std::vector<std::string> out;
      bool in_bytes = false;
      for (std::string& t : tokens) {
        const int b = FallbackByte(t);
        if (b < 0) {
          out.push_back(std::move(t));
          in_bytes = false;
        } else {
          if (!in_bytes) out.emplace_back();
          out.back().push_back(static_cast<char>(b));
          in_bytes = true;
        }
      }
      tokens = std::move(out);
    } else if (std::holds_alternative<FuseDecoder>(step)) {
      tokens = {absl::StrJoin(tokens, "")};
      fused = true;
    } else if (const auto* strip = std::get_if<StripDecoder>(&step)) {
      // After Fuse the one token is the whole text, whose ends a token
      // inside the text does not reach.
      if (inside && fused) continue;
      for (std::string& t : tokens) Strip(*strip, &t);
    } else if (const auto* meta = std::get_if<MetaspaceDecoder>(&step)) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        const bool drop = meta->drop_first && i == 0 && !inside;
        tokens[i] = absl::StrReplaceAll(tokens[i], {{meta->replacement, drop ? "" : " "}});
      }
    } else {
      // ByteLevel: characters of the alphabet become their bytes; a token
      // with other characters stays as it is. The result is one string.
      std::string joined;
      for (const std::string& t : tokens) {
        std::optional<std::string> raw = ByteLevelAlphabet::Decode(t);
        joined += raw.has_value() ? *raw : t;
      }
      tokens = {std::move(joined)};
      fused = true;
    }
  }
  return tokens;
}

std::string Decoder::Decode(std::span<const std::string_view> tokens) const {
  return absl::StrJoin(Run(std::vector<std::string>(tokens.begin(), tokens.end()), false), "");
}

std::string Decoder::DecodeToken(std::string_view token) const {
  return absl::StrJoin(Run({std::string(token)}, true), "");
}

}  // namespace pdserve::text
