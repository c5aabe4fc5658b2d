// Model configuration read from a Hugging Face model directory: config.json,
// plus generation_config.json when present (FromModelDir).
//
// Supported architectures (config.json "architectures"[0]) and what each
// adds to the Llama decoder (RMSNorm, rotate-half RoPE, GQA, SwiGLU MLP):
//   LlamaForCausalLM    attention_bias: bias on q/k/v/o projections;
//                       rope_scaling {"rope_type": "llama3", ...} (Llama 3.1+)
//   MistralForCausalLM  Llama math; sliding_window: each query attends to the
//                       `sliding_window` most recent positions, itself included
//   Qwen2ForCausalLM    bias on q/k/v projections (never on o)
//   Qwen3ForCausalLM    per-head RMSNorm on q and k before RoPE (q_norm,
//                       k_norm); head_dim from config; attention_bias as Llama
// Anything these do not cover (mlp_bias, other rope types, other activations,
// Qwen's use_sliding_window) is INVALID_ARGUMENT, never silently ignored.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::engine {

// RoPE frequency scaling (config.json "rope_scaling").
struct RopeScaling {
  enum class Type {
    kNone,    // absent, null, or rope_type "default"
    kLlama3,  // Hugging Face _compute_llama3_parameters
  };
  Type type = Type::kNone;
  // kLlama3 parameters, as named in config.json.
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 0;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"; see the list above
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;    // num_hidden_layers
  int num_heads = 0;     // num_attention_heads
  int num_kv_heads = 0;  // num_key_value_heads (defaults to num_heads)
  int head_dim = 0;      // defaults to hidden_size / num_heads
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;  // config.json without it: 1e-6, as Hugging Face
  float rope_theta = 10000.0f;
  bool tie_word_embeddings = false;
  int bos_token_id = -1;                // -1: none
  std::vector<int> eos_token_ids;       // may be empty
  std::string torch_dtype = "float32";  // dtype the checkpoint was saved in

  // Architecture features, derived from `architecture` and config.json keys.
  bool qkv_bias = false;   // q/k/v_proj have a bias (Qwen2; attention_bias)
  bool o_bias = false;     // o_proj has a bias (attention_bias)
  bool qk_norm = false;    // per-head q_norm/k_norm before RoPE (Qwen3)
  int sliding_window = 0;  // > 0: attend to this many latest positions; 0: all
  RopeScaling rope_scaling;

  // Parses and validates config.json text. Unknown architectures, missing or
  // non-positive sizes, and inconsistent head counts are INVALID_ARGUMENT.
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json_text);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);
  // Reads `model_dir`/config.json, then merges `model_dir`/generation_config.json
  // when it exists: its eos_token_id (int or list) ids are appended to
  // eos_token_ids (duplicates dropped) and its bos_token_id, when set,
  // replaces bos_token_id. A malformed generation_config.json or ids outside
  // the vocabulary are INVALID_ARGUMENT. Servers should load configs with this.
  static absl::StatusOr<ModelConfig> FromModelDir(const std::string& model_dir);
  // Merges generation_config.json text into this config as FromModelDir does.
  absl::Status MergeGenerationConfig(std::string_view json_text);
  // Serialises to config.json text in the Hugging Face spelling (model_type
  // and the architecture-specific keys included). Round-trips through FromJson.
  std::string ToJson() const;

  // RoPE inverse frequencies, head_dim / 2 of them, in fp32 exactly as
  // Hugging Face computes them: inv_freq[i] = 1 / theta^(2i / head_dim), then
  // rope_scaling applied (llama3: low frequencies divided by `factor`, a
  // smooth blend between the two wavelength thresholds).
  std::vector<float> RopeInverseFrequencies() const;

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  // Bytes of K and V for one token over all layers, at `bytes_per_element`.
  int64_t KvBytesPerToken(int bytes_per_element) const {
    return int64_t{2} * num_layers * num_kv_heads * head_dim * bytes_per_element;
  }
  bool IsEos(int token) const;

  // Weights of the decoder (embeddings, layers, final norm, LM head unless
  // tied; biases and q/k norms included).
  int64_t ParameterCount() const;
  // Forward FLOPs (multiply-add = 2) of a prefill of `num_tokens` tokens,
  // causal attention included.
  double PrefillFlops(int num_tokens) const;
};

}  // namespace pdserve::engine
