// Tiny configs of each supported architecture feature, for engine tests:
// Qwen2 q/k/v biases, Qwen3 q/k norms with a decoupled head_dim, Llama 3.1
// rope scaling, Llama attention_bias (o_proj bias too) and a Mistral sliding
// window. All derive from testing_models::TinyGqaConfig (4 heads, 2 KV heads).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "tests/unit/engine/tiny_models.h"

namespace pdserve::engine::testing_models {

inline ModelConfig TinyQwen2Config() {
  ModelConfig c = TinyGqaConfig();
  c.architecture = "Qwen2ForCausalLM";
  c.qkv_bias = true;
  c.rope_theta = 1000000.0f;
  c.tie_word_embeddings = true;
  return c;
}

inline ModelConfig TinyQwen3Config() {
  ModelConfig c = TinyGqaConfig();
  c.architecture = "Qwen3ForCausalLM";
  c.qk_norm = true;
  c.head_dim = 24;  // != hidden / heads (16), as in real Qwen3 checkpoints
  c.rms_norm_eps = 1e-6f;
  return c;
}

// Llama 3.1 scaling with a small original context, so that head_dim 16 at
// theta 10000 has high (unchanged), medium (smoothed) and low (divided by
// factor) frequencies.
inline ModelConfig TinyLlama3RopeConfig() {
  ModelConfig c = TinyGqaConfig();
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_max_position_embeddings = 64;
  return c;
}

inline ModelConfig TinyLlamaAttentionBiasConfig() {
  ModelConfig c = TinyGqaConfig();
  c.qkv_bias = c.o_bias = true;
  return c;
}

// Window of 5: prompts of 7..13 tokens and decode steps all cross it.
inline ModelConfig TinyMistralWindowConfig() {
  ModelConfig c = TinyGqaConfig();
  c.architecture = "MistralForCausalLM";
  c.sliding_window = 5;
  return c;
}

// Every architecture the engine serves, each with the checkpoint dtype its
// tests write, for suites that run on all of them.
struct ArchCase {
  std::string name;
  ModelConfig config;
  std::string dtype;
};
inline void PrintTo(const ArchCase& c, std::ostream* os) { *os << c.name; }
inline std::vector<ArchCase> AllArchCases() {
  return {{"gqa_untied_f32", TinyGqaConfig(), "f32"},
          {"mha_tied_bf16", TinyTiedConfig(), "bf16"},
          {"qwen2_bias", TinyQwen2Config(), "f32"},
          {"qwen3_qk_norm_f16", TinyQwen3Config(), "f16"},
          {"llama3_rope", TinyLlama3RopeConfig(), "f32"},
          {"llama_attention_bias", TinyLlamaAttentionBiasConfig(), "bf16"},
          {"mistral_window", TinyMistralWindowConfig(), "f32"}};
}

}  // namespace pdserve::engine::testing_models
