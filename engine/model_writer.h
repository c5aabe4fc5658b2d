// Writes deterministic random-weight Llama checkpoints in the Hugging Face
// layout (config.json + model.safetensors), for tests, demos and benchmarks.
//
// Initialisation, from std::mt19937_64(seed) (fully specified by the
// standard) through a self-written Box-Muller transform, so a seed gives the
// same weights with any standard library (up to libm rounding of log/sin/cos):
//   projection matrices  N(0, 1/in_features)   so activations stay O(1) and
//                        attention scores have std ~1 (not uniform attention)
//   embed_tokens         N(0, 1); N(0, 1/hidden) when tied, so the tied LM
//                        head, like a separate one, gives logits with std ~1
//   lm_head              N(0, 1/hidden)  -> logits with std ~1
//   norm weights         1 + N(0, 0.05^2)
// Tensors are drawn in LlamaWeightSpecs order, so a seed fixes the model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/config.h"

namespace pdserve::engine {

// The demo model: byte-level vocabulary (0..255 bytes, 256 BOS, 257 EOS,
// rest unused) of 320, hidden 256, intermediate 688, 4 layers, 8 heads,
// 4 KV heads, 1024 positions, rope_theta 10000.
ModelConfig DefaultDemoConfig();

// Writes `config` with random weights into `out_dir` (created if missing).
// `dtype` is "f32" or "bf16". `config` is validated as config.json would be:
// INVALID_ARGUMENT if it is not a valid Llama config.
absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed, std::string_view dtype,
                              const std::string& out_dir);

}  // namespace pdserve::engine
