// The "decoder" of a tokenizer.json whose vocabulary is text rather than
// bytes (SentencePiece-converted tokenizers: Llama 2, Mistral 7B v0.1, ...):
// a chain of steps that turns token strings back into text, following the
// Rust `tokenizers` library's decode_chain:
//   Replace       every occurrence of a literal string in each token replaced
//                 ("▁" -> " ")
//   ByteFallback  "<0xNN>" tokens become the byte NN
//   Fuse          all tokens joined into one
//   Strip         up to `start` leading and `stop` trailing `content`
//                 characters cut from each token (the whole text after Fuse)
//   Metaspace     "▁" becomes " " in every token; in the first token it is
//                 dropped (unless prepend_scheme is never)
//   ByteLevel     byte-level alphabet -> bytes
//   Sequence      the steps in order (flattened by the parser)
// Bytes stay raw (ByteFallback bytes may be part of a UTF-8 character); the
// caller repairs the result to valid UTF-8.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::text {

struct ReplaceDecoder {
  std::string pattern;  // literal, non-empty
  std::string content;
};
struct ByteFallbackDecoder {};
struct FuseDecoder {};
struct StripDecoder {
  std::string content;  // one character
  int start = 0;
  int stop = 0;
};
struct MetaspaceDecoder {
  std::string replacement = "\u2581";  // one character
  bool drop_first = true;              // prepend_scheme is not "never"
};
struct ByteLevelDecoder {};

using DecoderStep = std::variant<ReplaceDecoder, ByteFallbackDecoder, FuseDecoder, StripDecoder,
                                 MetaspaceDecoder, ByteLevelDecoder>;

class Decoder {
 public:
  // INVALID_ARGUMENT for an empty Replace pattern, a Strip or Metaspace
  // character that is not one UTF-8 character, or negative Strip counts.
  static absl::StatusOr<Decoder> Create(std::vector<DecoderStep> steps);

  // Text of the token strings `tokens`, decoded as one text from its start:
  // the chain applied to all of them, then joined.
  std::string Decode(std::span<const std::string_view> tokens) const;

  // Text of `token` inside a text: the chain applied to it alone as a token
  // that is neither first (Metaspace keeps its space) nor at either end of
  // the text (Strip after Fuse cuts nothing). Concatenating these for every
  // token gives what a stream continuing earlier text shows.
  std::string DecodeToken(std::string_view token) const;

 private:
  std::vector<std::string> Run(std::vector<std::string> tokens, bool inside) const;
  std::vector<DecoderStep> steps_;
};

}  // namespace pdserve::text
