// Model configuration read from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::engine {

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;        // num_hidden_layers
  int num_heads = 0;         // num_attention_heads
  int num_kv_heads = 0;      // num_key_value_heads (defaults to num_heads)
  int head_dim = 0;          // defaults to hidden_size / num_heads
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool tie_word_embeddings = false;
  int bos_token_id = -1;               // -1: none
  std::vector<int> eos_token_ids;      // may be empty
  std::string torch_dtype = "float32"; // dtype the checkpoint was saved in

  // Parses and validates config.json text. Unknown architectures, missing or
  // non-positive sizes, and inconsistent head counts are INVALID_ARGUMENT.
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json_text);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);
  // Serialises to config.json text in the Hugging Face spelling.
  std::string ToJson() const;

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  // Bytes of K and V for one token over all layers, at `bytes_per_element`.
  int64_t KvBytesPerToken(int bytes_per_element) const {
    return int64_t{2} * num_layers * num_kv_heads * head_dim * bytes_per_element;
  }
  bool IsEos(int token) const;

  // Weights of the decoder (embeddings, layers, final norm, LM head unless tied).
  int64_t ParameterCount() const;
  // Forward FLOPs (multiply-add = 2) of a prefill of `num_tokens` tokens,
  // causal attention included.
  double PrefillFlops(int num_tokens) const;
};

}  // namespace pdserve::engine
