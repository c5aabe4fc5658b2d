// Tokenizers turn text into token ids and back. The router tokenizes and
// detokenizes; workers see token ids only.
//
// Implementations: ByteTokenizer (below: token b is byte b), NoTextTokenizer
// (ids only) and BpeTokenizer (text/bpe_tokenizer.h: Hugging Face
// tokenizer.json, byte-level and text BPE).
// text/tokenizer_loader.h picks one for a model directory. All methods are
// const and safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text` (any bytes; invalid UTF-8 is tokenized as it comes).
  // Special tokens written in the text (e.g. "<|im_start|>") become their ids.
  // Adds nothing: no BOS/EOS (see add_bos_token()).
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;

  // Like Encode, but special tokens in the text are tokenized as plain text, so
  // user text cannot inject control tokens. Non-special added tokens still
  // match. Defaults to Encode (right for tokenizers without special tokens).
  virtual std::vector<int32_t> EncodeOrdinary(std::string_view text) const { return Encode(text); }

  // Raw bytes of a token (may be part of a UTF-8 character); empty for
  // special tokens (see SpecialTokenText) and for ids with no token.
  virtual std::string TokenBytes(int32_t token) const = 0;

  // Text of a special token (e.g. "<|eot_id|>"); empty for ordinary tokens,
  // for special tokens without text and for unknown ids.
  virtual std::string SpecialTokenText(int32_t token) const { return ""; }

  // True for control tokens (BOS, EOS, <|im_start|>, ...): skipped when text
  // is decoded with skip_special_tokens.
  virtual bool IsSpecial(int32_t token) const { return false; }

  // Id of the token whose vocabulary string (or added-token content) is
  // exactly `token`, e.g. TokenId("<|eot_id|>"). Vocabulary strings of
  // byte-level BPE are in the byte-to-unicode alphabet ("Ġthe").
  virtual std::optional<int32_t> TokenId(std::string_view token) const { return std::nullopt; }

  // BOS and EOS as the tokenizer files name them (tokenizer_config.json);
  // nullopt when not named. The model's config.json may name others.
  virtual std::optional<int32_t> bos_token_id() const { return std::nullopt; }
  virtual std::optional<int32_t> eos_token_id() const { return std::nullopt; }
  // Whether the tokenizer files ask for BOS before a text prompt (a
  // TemplateProcessing post-processor that starts with it, or
  // "add_bos_token": true). Encode never adds it; the caller decides.
  virtual bool add_bos_token() const { return false; }

  // One past the largest token id (ids below it may still have no token).
  virtual int vocab_size() const = 0;

  // Text of `ids` as one text (Hugging Face's decode, without
  // clean_up_tokenization_spaces): bytes of all tokens, with special tokens
  // as their text unless skipped, made valid UTF-8 (ill-formed bytes become
  // U+FFFD the way IncrementalDetokenizer does it). By default the
  // concatenated deltas of an IncrementalDetokenizer with the same option,
  // flushed; a tokenizer whose decoder treats the start of a text apart
  // (SentencePiece's leading "▁", see bpe_tokenizer.h) overrides it, and
  // then the stream keeps what Decode drops there.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;
};

// Byte-level tokenizer: token b (0..255) is byte b; ids >= 256 are special
// tokens with no text. Needs vocab_size >= 256.
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int vocab_size) : vocab_size_(vocab_size) {}
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t token) const override;
  bool IsSpecial(int32_t token) const override { return token >= 256 && token < vocab_size_; }
  int vocab_size() const override { return vocab_size_; }

 private:
  int vocab_size_;
};

// Token ids without text, for a model whose tokenizer files cannot be used:
// Encode gives nothing and every token has empty text. Whoever holds it must
// refuse text input (the router does).
class NoTextTokenizer final : public Tokenizer {
 public:
  explicit NoTextTokenizer(int vocab_size) : vocab_size_(vocab_size) {}
  std::vector<int32_t> Encode(std::string_view) const override { return {}; }
  std::string TokenBytes(int32_t) const override { return ""; }
  int vocab_size() const override { return vocab_size_; }

 private:
  int vocab_size_;
};

// Turns a stream of tokens into text deltas made of whole, valid UTF-8
// characters: incomplete sequences are held back until completed, and invalid
// bytes become U+FFFD. Special tokens add nothing by default; with
// skip_special_tokens = false they add SpecialTokenText (which, like any
// complete character, ends an incomplete sequence held back before it).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}
  // Returns the text that became complete with `token`.
  std::string Push(int32_t token);
  // Returns whatever is held back, with incomplete characters as U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

}  // namespace pdserve::text
