// BPE tokenizer read from a Hugging Face tokenizer.json, following the Rust
// `tokenizers` library's semantics. Two kinds of files:
//   - byte-level BPE (a ByteLevel pre-tokenizer; the GPT-2 family: Llama 3,
//     Qwen2/2.5/3): the vocabulary is written in the byte-level alphabet and
//     the model merges bytes;
//   - text BPE (no ByteLevel pre-tokenizer; SentencePiece-converted files:
//     Llama 2, Mistral 7B v0.1, ...): the vocabulary is UTF-8 text ("▁the"),
//     the model merges characters, a character outside the vocabulary falls
//     back to its <0xXX> byte tokens (byte_fallback) or to unk_token (fused
//     into one with fuse_unk), and the decoder chain turns tokens into text.
// Encoding:
//   1. added tokens (special or not) are cut out of the raw text first
//      (leftmost-longest; lstrip/rstrip/single_word honoured), then those
//      marked "normalized" out of the normalized rest;
//   2. normalizer: null, NFC/NFD/NFKC/NFKD, Prepend, Replace or a Sequence
//      of them (see normalizer.h), per piece between added tokens;
//   3. pre_tokenizer: null, Split(Regex|String, any behaviour, invert),
//      ByteLevel and Metaspace, alone or in a Sequence (see pretokenizer.h);
//   4. model BPE with merges as "a b" strings or [a, b] pairs, ignore_merges,
//      byte_fallback, unk_token and fuse_unk; merges are applied lowest rank
//      first, leftmost first among equals.
// decoder: ByteLevel, ByteFallback, Fuse, Replace(String), Strip, Metaspace,
// Sequence (see decoder.h). Other components (WordPiece, Unigram, ...) are
// refused with UNIMPLEMENTED. The post_processor is not applied;
// add_bos_token() and prefix_tokens() report what it would add.
//
// Encoding repairs ill-formed UTF-8 input to U+FFFD first. TokenBytes gives a
// token's text inside a stream: raw bytes (byte-level alphabet reversed;
// <0xXX> tokens with a ByteFallback decoder), the decoder chain's text of a
// token that is not first (text vocabularies: "▁the" -> " the"); added
// tokens give their content. Decode of a text vocabulary runs the decoder
// chain over the whole sequence, which drops the space encoding put before
// the first word (Strip, Metaspace): so Decode(ids) may lack a leading space
// that an IncrementalDetokenizer continuing a prompt shows. Invalid UTF-8
// from byte tokens becomes U+FFFD per maximal ill-formed subpart (as the
// WHATWG decoder and transformers.js do; the Rust library's ByteFallback
// writes one per byte). Thread-safe; a small per-thread cache keeps the BPE
// result of recent words.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "text/tokenizer.h"

namespace pdserve::text {

// A tokenizer.json "added_tokens" entry.
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // control token: skipped by skip_special_tokens
  bool lstrip = false;       // absorbs the whitespace on its left
  bool rstrip = false;       // absorbs the whitespace on its right
  bool normalized = false;   // matched in normalized text instead of raw text
  bool single_word = false;  // matched only when not inside a word
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Parses tokenizer.json text. `tokenizer_config_json` (tokenizer_config.json
  // text, may be empty) names bos_token / eos_token and may set
  // add_bos_token. INVALID_ARGUMENT for malformed or inconsistent files,
  // UNIMPLEMENTED for components outside the list above.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json = {});
  ~BpeTokenizer() override;

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::vector<int32_t> EncodeOrdinary(std::string_view text) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const override;
  std::string TokenBytes(int32_t token) const override;
  std::string SpecialTokenText(int32_t token) const override;
  bool IsSpecial(int32_t token) const override;
  std::optional<int32_t> TokenId(std::string_view token) const override;
  std::optional<int32_t> bos_token_id() const override;
  std::optional<int32_t> eos_token_id() const override;
  bool add_bos_token() const override;
  int vocab_size() const override;

  // Ids the post-processor (TemplateProcessing "single") puts before and after
  // one sequence; what HF's add_special_tokens=True adds. Not applied by Encode.
  const std::vector<int32_t>& prefix_tokens() const;
  const std::vector<int32_t>& suffix_tokens() const;
  // The added tokens, in file order.
  std::span<const AddedToken> added_tokens() const;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::vector<int32_t> EncodeImpl(std::string_view text, bool parse_special) const;

  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve::text
