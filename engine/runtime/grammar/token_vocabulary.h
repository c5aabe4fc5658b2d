// The bytes each token id stands for, as a grammar sees generated text, and
// the vocabulary sorted by those bytes: consecutive tokens share prefixes,
// so a walk over the sorted list with each token's common-prefix length to
// the one before visits every distinct prefix once (the trie of the
// vocabulary, flattened). Immutable; shared by every grammar compiled for a
// model.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::engine::grammar {

class TokenVocabulary {
 public:
  // token_bytes[id]: the bytes token `id` adds to the text; empty for ids a
  // grammar never allows (special tokens, ids without a token). `eos_ids`
  // end the output (the model's end-of-sequence ids).
  TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int> eos_ids);

  int size() const { return static_cast<int>(bytes_.size()); }
  std::string_view bytes(int32_t id) const { return bytes_[id]; }
  std::span<const int> eos_ids() const { return eos_ids_; }
  // Ids with bytes, sorted by their bytes; prefix(i): bytes sorted[i] shares
  // with sorted[i - 1] (0 for i = 0).
  std::span<const int32_t> sorted() const { return sorted_; }
  int32_t prefix(size_t i) const { return prefix_[i]; }
  int max_token_bytes() const { return max_len_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int> eos_ids_;
  std::vector<int32_t> sorted_;
  std::vector<int32_t> prefix_;
  int max_len_ = 0;
};

}  // namespace pdserve::engine::grammar
