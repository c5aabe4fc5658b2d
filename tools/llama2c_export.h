// Writes a Llama model in the checkpoint format of llama2.c's run.c (the
// "legacy" version-0 .bin), so the two programs can be run side by side on
// the same weights (bench/llama2c_side_by_side.sh). The format, as run.c
// reads it:
//   int32 x 7: dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//              vocab_size (negated when the LM head is not tied), seq_len
//   fp32:      token_embedding [vocab, dim], rms_att [L, dim],
//              wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim],
//              wo [L, dim, dim], rms_ffn [L, dim], w1 = gate [L, hidden, dim],
//              w2 = down [L, dim, hidden], w3 = up [L, hidden, dim],
//              rms_final [dim], two unused RoPE tables of seq_len * head_size
//              / 2 values each (written as zeros), then wcls [vocab, dim]
//              when untied.
// run.c rotates interleaved pairs (2j, 2j + 1) of each head; Hugging Face
// checkpoints rotate (j, j + head_dim / 2). The export permutes the rows of
// wq and wk within each head (row 2j <- j, row 2j + 1 <- j + head_dim / 2),
// which leaves every q.k product, and so the model, unchanged.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace pdserve::engine {

// OK when `config` is a plain Llama: the Llama or Mistral architecture
// without biases, q/k norms, a sliding window or rope scaling; else
// INVALID_ARGUMENT "<who> cannot run this model: <what>". (Also for the GGUF
// export, tools/gguf_export.h.)
absl::Status CheckPlainLlama(const ModelConfig& config, std::string_view who);

// INVALID_ARGUMENT when run.c cannot express `config`: an architecture other
// than Llama/Mistral, biases, q/k norms, a sliding window, rope scaling,
// rope_theta other than 10000, or head_dim != hidden_size / num_heads.
// (run.c also fixes rms_norm_eps at 1e-5.)
absl::Status CheckLlama2cCompatible(const ModelConfig& config);

// Writes `weights` to `path` as above. seq_len = max_position_embeddings.
absl::Status WriteLlama2cCheckpoint(const ModelConfig& config, const ModelWeights& weights,
                                    const std::string& path);

// Writes a tokenizer.bin run.c can load for `vocab_size` tokens (it decodes
// every sampled id to text): int32 max_token_length, then per token fp32
// score, int32 length and the bytes. Token i is the text "<i>".
absl::Status WriteLlama2cTokenizer(int vocab_size, const std::string& path);

// Row permutation of wq/wk for one head group: out row 2j + p of each head
// comes from row j + p * head_dim / 2. Exposed for tests.
std::vector<float> InterleaveRopeRows(const std::vector<float>& w, int num_heads, int head_dim,
                                      int cols);

}  // namespace pdserve::engine
