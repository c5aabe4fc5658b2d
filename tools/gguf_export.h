// Writes a Llama model as a GGUF file (version 3) that llama.cpp loads as
// architecture "llama", so the two engines can be run side by side on the
// same weights (bench/llamacpp_side_by_side.sh). Every matrix and norm is
// written in fp32 (general.file_type 0, "all F32"); llama.cpp's
// llama-quantize makes the bf16, Q8_0 and Q4_0 files from it.
//
// Tensors (GGUF lists dimensions innermost first: a [rows, cols] matrix is
// [cols, rows]): token_embd, output_norm, output (absent when the LM head is
// tied), and per layer blk.N.{attn_norm, attn_q, attn_k, attn_v,
// attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}. llama.cpp rotates
// interleaved pairs (2j, 2j + 1) of each head, as run.c does, so attn_q and
// attn_k rows are permuted as llama2c_export.h describes (and as llama.cpp's
// own converter does).
//
// Vocabulary: a "llama" (SentencePiece-type) vocabulary of vocab_size
// tokens whose token i is the text "<i>" (0 unknown, 1 BOS, 2 EOS, the rest
// normal), so llama.cpp prints every generated id as "<id>"; BOS is added.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace pdserve::engine {

inline constexpr int kGgufBosId = 1;
inline constexpr int kGgufEosId = 2;

// INVALID_ARGUMENT when llama.cpp's "llama" architecture cannot express
// `config`: another architecture than Llama/Mistral, biases, q/k norms, a
// sliding window or rope scaling, or vocab_size < 3.
absl::Status CheckGgufCompatible(const ModelConfig& config);

// Writes `weights` to `path` as above; INTERNAL when the file cannot be
// written.
absl::Status WriteGguf(const ModelConfig& config, const ModelWeights& weights,
                       const std::string& path);

}  // namespace pdserve::engine
