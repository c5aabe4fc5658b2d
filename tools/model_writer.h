// Writes deterministic random-weight checkpoints of every supported
// architecture (Llama, Mistral, Qwen2, Qwen3; see engine/model/config.h) in the
// Hugging Face layout: config.json, model.safetensors or shards plus
// model.safetensors.index.json, and optionally generation_config.json. For
// tests, demos, benchmarks and the torch reference check.
//
// Initialisation, from std::mt19937_64(seed) (fully specified by the
// standard) through a self-written Box-Muller transform, so a seed gives the
// same weights with any standard library (up to libm rounding of log/sin/cos):
//   projection matrices  N(0, 1/in_features)   so activations stay O(1) and
//                        attention scores have std ~1 (not uniform attention)
//   embed_tokens         N(0, 1); N(0, 1/hidden) when tied, so the tied LM
//                        head, like a separate one, gives logits with std ~1
//   lm_head              N(0, 1/hidden)  -> logits with std ~1
//   biases (*.bias)      N(0, 0.5^2)     large enough that a dropped bias shows
//   norm weights         1 + N(0, 0.05^2) (layer norms and Qwen3 q/k norms)
// Tensors are drawn in ModelWeightSpecs order, so a seed fixes the model
// (Llama models are unchanged from earlier versions of this writer).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/config.h"

namespace pdserve::engine {

// The demo model: byte-level vocabulary (0..255 bytes, 256 BOS, 257 EOS,
// rest unused) of 320, hidden 256, intermediate 688, 4 layers, 8 heads,
// 4 KV heads, 1024 positions, rope_theta 10000.
ModelConfig DefaultDemoConfig();

// The demo model as architecture `arch` ("llama", "mistral", "qwen2" or
// "qwen3"): architecture name and its features (Qwen2 q/k/v biases, Qwen3
// q/k norms) set; Mistral without a sliding window. INVALID_ARGUMENT for
// other names.
absl::StatusOr<ModelConfig> DemoConfigForArchitecture(std::string_view arch);

struct RandomModelOptions {
  uint64_t seed = 1;
  std::string dtype = "f32";  // "f32", "bf16" or "f16"
  // 1: model.safetensors. N > 1: model-0000i-of-0000N.safetensors (tensors in
  // ModelWeightSpecs order, split into N runs of about equal bytes) plus
  // model.safetensors.index.json. At most the number of tensors.
  int num_shards = 1;
  // Writes generation_config.json with these ids (bos omitted when < 0).
  bool write_generation_config = false;
  std::vector<int> generation_eos_token_ids;
  int generation_bos_token_id = -1;
};

// Writes `config` with random weights into `out_dir` (created if missing),
// replacing any model.safetensors, index, shards of the same naming, and
// generation_config.json written there before. `config` is validated as
// config.json would be (INVALID_ARGUMENT if invalid); the written
// config.json is the canonical ToJson() of the parsed config.
absl::Status WriteRandomModel(const ModelConfig& config, const RandomModelOptions& options,
                              const std::string& out_dir);

// Single-file shorthand: `dtype` is "f32", "bf16" or "f16".
absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed, std::string_view dtype,
                              const std::string& out_dir);

}  // namespace pdserve::engine
