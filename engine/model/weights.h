// Decoder weights in fp32 (converted from F32/F16/BF16 on load), loaded by
// their Hugging Face names from a single-file or sharded safetensors
// checkpoint and checked against a ModelConfig, plus the model fingerprint.
//
// Every matrix is row-major [out_features, in_features] exactly as stored by
// torch.nn.Linear, so y = x W^T (+ b). Names, shapes (H = hidden_size,
// Q = num_heads*head_dim, KV = num_kv_heads*head_dim, I = intermediate_size,
// D = head_dim):
//   model.embed_tokens.weight                        [vocab, H]
//   model.layers.N.input_layernorm.weight            [H]
//   model.layers.N.self_attn.q_proj.weight           [Q, H]
//   model.layers.N.self_attn.q_proj.bias             [Q]   (config.qkv_bias)
//   model.layers.N.self_attn.{k,v}_proj.weight       [KV, H]
//   model.layers.N.self_attn.{k,v}_proj.bias         [KV]  (config.qkv_bias)
//   model.layers.N.self_attn.o_proj.weight           [H, Q]
//   model.layers.N.self_attn.o_proj.bias             [H]   (config.o_bias)
//   model.layers.N.self_attn.{q,k}_norm.weight       [D]   (config.qk_norm)
//   model.layers.N.post_attention_layernorm.weight   [H]
//   model.layers.N.mlp.{gate,up}_proj.weight         [I, H]
//   model.layers.N.mlp.down_proj.weight              [H, I]
//   model.norm.weight                                [H]
//   lm_head.weight                                   [vocab, H] (absent if tied)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/safetensors.h"

namespace pdserve::engine {

struct LayerWeights {
  std::vector<float> input_norm;  // [H]
  std::vector<float> q_proj;      // [Q, H]
  std::vector<float> q_bias;      // [Q]; empty unless config.qkv_bias
  std::vector<float> k_proj;      // [KV, H]
  std::vector<float> k_bias;      // [KV]; empty unless config.qkv_bias
  std::vector<float> v_proj;      // [KV, H]
  std::vector<float> v_bias;      // [KV]; empty unless config.qkv_bias
  std::vector<float> o_proj;      // [H, Q]
  std::vector<float> o_bias;      // [H]; empty unless config.o_bias
  std::vector<float> q_norm;      // [D]; empty unless config.qk_norm
  std::vector<float> k_norm;      // [D]; empty unless config.qk_norm
  std::vector<float> post_norm;   // [H]
  std::vector<float> gate_proj;   // [I, H]
  std::vector<float> up_proj;     // [I, H]
  std::vector<float> down_proj;   // [H, I]
};

struct ModelWeights {
  std::vector<float> embed_tokens;  // [vocab, H]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [H]
  std::vector<float> lm_head;     // [vocab, H]; empty when tied
  // Identifies config + weights; see ComputeFingerprint.
  uint64_t fingerprint = 0;

  // The LM head: lm_head, or embed_tokens when the embeddings are tied.
  const std::vector<float>& lm_head_or_embed() const {
    return lm_head.empty() ? embed_tokens : lm_head;
  }
};

// Name and expected shape of every tensor `config` needs, in load order (the
// order of the table above, optional tensors only when the config has them).
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<WeightSpec> ModelWeightSpecs(const ModelConfig& config);

// Loads every tensor of ModelWeightSpecs(config) from `checkpoint`. NOT_FOUND
// names a missing tensor; INVALID_ARGUMENT names a tensor with the wrong shape
// (both shapes) or a dtype other than F32/F16/BF16. Extra tensors are ignored
// (e.g. lm_head.weight in a tied checkpoint).
absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config,
                                         const SafetensorsCheckpoint& checkpoint);

// Opens `model_dir` (SafetensorsCheckpoint::Open) and loads it for `config`.
absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& config,
                                              const std::string& model_dir);

// 64-bit FNV-1a over the config's shape- and math-defining fields, every
// tensor's name and shape, and a sample of its values (the first and last 64
// floats and every 257th one). Two different random models differ with
// overwhelming probability; the same weights always give the same value.
uint64_t ComputeFingerprint(const ModelConfig& config, const ModelWeights& weights);
// The config's shape- and math-defining fields alone (architecture,
// dimensions, vocabulary, norms, RoPE): what a process that reads only
// config.json can compare.
uint64_t ConfigFingerprint(const ModelConfig& config);

// The same hash over tensors given in ModelWeightSpecs(config) order as
// (name, shape, element count, element accessor): how WeightSource
// fingerprints weights it never converts as a whole.
struct FingerprintTensor {
  const std::string* name;
  const std::vector<int64_t>* shape;
  int64_t size;
  std::function<float(int64_t)> at;
};
uint64_t ComputeFingerprint(const ModelConfig& config, std::span<const FingerprintTensor> tensors);

}  // namespace pdserve::engine
