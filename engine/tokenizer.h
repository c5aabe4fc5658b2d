// Tokenizers turn text into token ids and back. The router tokenizes and
// detokenizes; workers see token ids only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // Raw bytes of a token (may be part of a UTF-8 character); empty for
  // special tokens.
  virtual std::string TokenBytes(int32_t token) const = 0;
  virtual int vocab_size() const = 0;
};

// Byte-level tokenizer: token b (0..255) is byte b; ids >= 256 are special
// tokens with no text. Needs vocab_size >= 256.
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int vocab_size) : vocab_size_(vocab_size) {}
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t token) const override;
  int vocab_size() const override { return vocab_size_; }

 private:
  int vocab_size_;
};

// Turns a stream of tokens into text deltas made of whole, valid UTF-8
// characters: incomplete sequences are held back until completed, and invalid
// bytes become U+FFFD.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Returns the text that became complete with `token`.
  std::string Push(int32_t token);
  // Returns whatever is held back, with incomplete characters as U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

}  // namespace pdserve::engine
