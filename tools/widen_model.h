// Widens a checkpoint k times without changing what it computes: every
// hidden unit, MLP unit, attention head and key/value head is repeated k
// times (new index i holds old index i mod d), and each matrix whose input
// was repeated is divided by k, so every product sums k equal copies of the
// original product. The residual stream becomes k copies of the original
// one, which RMSNorm leaves as it is (the mean square of k copies is the
// mean square of one); the final norm is divided by k so that the LM head
// (or the tied embedding), whose input is k copies, gives the original
// logits. Head size, vocabulary, layers, RoPE, norms of q and k (Qwen3) and
// sliding windows are unchanged; grouped-query attention maps copy c of
// query head h to copy c of its key/value head.
//
// In exact arithmetic the widened model gives the original logits; in
// floating point they differ by summation order only, and a power-of-two k
// keeps the divided bf16/f16 weights exact. It reads k^2 times the bytes per
// decode step: how the trained demo model, which a CPU's last-level cache
// holds, is turned into a target whose decode steps stream weights from
// memory as a real checkpoint's do, with the demo model's tokens.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace pdserve::engine {

struct WidenOptions {
  int factor = 2;     // k >= 2
  std::string dtype;  // "f32", "bf16", "f16"; empty: the source's torch_dtype
};

// Reads the checkpoint in `in_dir` (config.json and safetensors, single file
// or sharded) and writes the widened one to `out_dir` (config.json,
// model.safetensors, and every other file of in_dir that is not a
// checkpoint file but the source's README, copied: the tokenizer, the
// generation config). The widened tensors are held in memory as fp32 while
// they are written: a tool for small models. INVALID_ARGUMENT for a factor
// outside [2, 64], an unknown dtype, or out_dir equal to in_dir.
absl::Status WidenCheckpoint(const std::string& in_dir, const std::string& out_dir,
                             const WidenOptions& options);

}  // namespace pdserve::engine
