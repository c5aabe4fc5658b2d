// Llama weights in fp32, loaded by their Hugging Face names and checked
// against a ModelConfig, plus the model fingerprint.
//
// Every matrix is row-major [out_features, in_features] exactly as stored by
// torch.nn.Linear, so y = x W^T. Names, shapes (H = hidden_size,
// Q = num_heads*head_dim, KV = num_kv_heads*head_dim, I = intermediate_size):
//   model.embed_tokens.weight                        [vocab, H]
//   model.layers.N.input_layernorm.weight            [H]
//   model.layers.N.self_attn.q_proj.weight           [Q, H]
//   model.layers.N.self_attn.{k,v}_proj.weight       [KV, H]
//   model.layers.N.self_attn.o_proj.weight           [H, Q]
//   model.layers.N.post_attention_layernorm.weight   [H]
//   model.layers.N.mlp.{gate,up}_proj.weight         [I, H]
//   model.layers.N.mlp.down_proj.weight              [H, I]
//   model.norm.weight                                [H]
//   lm_head.weight                                   [vocab, H] (absent if tied)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/safetensors.h"

namespace pdserve::engine {

struct LayerWeights {
  std::vector<float> input_norm;  // [H]
  std::vector<float> q_proj;      // [Q, H]
  std::vector<float> k_proj;      // [KV, H]
  std::vector<float> v_proj;      // [KV, H]
  std::vector<float> o_proj;      // [H, Q]
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

// Name and expected shape of every tensor `config` needs, in load order.
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<WeightSpec> LlamaWeightSpecs(const ModelConfig& config);

// Loads every tensor of LlamaWeightSpecs(config) from `file`. NOT_FOUND names a
// missing tensor; INVALID_ARGUMENT names a tensor with the wrong shape (both
// shapes) or an unreadable dtype. Extra tensors in the file are ignored.
absl::StatusOr<ModelWeights> LoadLlamaWeights(const ModelConfig& config,
                                              const SafetensorsFile& file);

// Loads `model_dir`/model.safetensors for `config`.
absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& config,
                                              const std::string& model_dir);

// 64-bit FNV-1a over the config's shape-defining fields, every tensor's name
// and shape, and a sample of its values (the first and last 64 floats and
// every 257th one). Two different random models differ with overwhelming
// probability; the same weights always give the same value.
uint64_t ComputeFingerprint(const ModelConfig& config, const ModelWeights& weights);

}  // namespace pdserve::engine
