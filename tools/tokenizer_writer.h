// Writes the tokenizer files of a self-made model in the Hugging Face layout,
// so demo and test models go through the same tokenizer and chat-template
// code as a real Llama 3 checkpoint:
//   tokenizer.json         byte-level BPE, Llama 3 split pattern, ids 0..255
//                          the 256 bytes (id b = byte b, as ByteTokenizer),
//                          then the Llama 3 control tokens, then merges
//                          learned from a small built-in English corpus
//   tokenizer_config.json  bos_token, eos_token, add_bos_token and the
//                          Llama 3 Instruct chat template
//
// Token ids (vocab_size V >= 261):
//   256 <|begin_of_text|>   (BOS)      259 <|end_header_id|>
//   257 <|end_of_text|>                260 <|eot_id|>  (end of a chat turn)
//   258 <|start_header_id|>            261 .. V-1      BPE merges, in rank order
// A model written with this tokenizer should list 257 and 260 as EOS
// (generation_config.json), as Llama 3 Instruct does.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace pdserve::engine {

inline constexpr int kDemoBosId = 256;
inline constexpr int kDemoEndOfTextId = 257;
inline constexpr int kDemoEotId = 260;
inline constexpr int kDemoFirstMergeId = 261;

// Writes tokenizer.json and tokenizer_config.json into `out_dir` (which must
// exist) for a vocabulary of `vocab_size` ids, with merges learned from
// `corpus` (empty: the built-in text). Merges stop early when no pair occurs
// twice, so the vocabulary may use fewer ids. INVALID_ARGUMENT when
// vocab_size < kDemoFirstMergeId; INTERNAL when a file cannot be written.
absl::Status WriteDemoTokenizer(int vocab_size, const std::string& out_dir,
                                std::string_view corpus = {});

}  // namespace pdserve::engine
