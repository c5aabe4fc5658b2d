#include "bench/model_shapes.h"

#include "absl/strings/str_cat.h"

namespace pdserve::bench {
namespace {

using engine::ModelConfig;

ModelConfig Llama3Shape(int hidden, int inter, int layers, int head_dim, bool tied,
                        float rope_factor) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_layers = layers;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = head_dim;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {.type = engine::RopeScaling::Type::kLlama3,
                    .factor = rope_factor,
                    .low_freq_factor = 1.0f,
                    .high_freq_factor = 4.0f,
                    .original_max_position_embeddings = 8192};
  c.tie_word_embeddings = tied;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001};
  return c;
}

ModelConfig Qwen3Shape() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 151936;
  c.hidden_size = 1024;
  c.intermediate_size = 3072;
  c.num_layers = 28;
  c.num_heads = 16;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645};
  return c;
}

ModelConfig Tiny() {
  ModelConfig c = Llama3Shape(64, 128, 2, 16, false, 8.0f);
  c.vocab_size = 256;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_position_embeddings = 512;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

ModelConfig TinyQwen3() {
  ModelConfig c = Qwen3Shape();
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 24;  // != hidden / heads, as in Qwen3 checkpoints
  c.max_position_embeddings = 512;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelShape(const std::string& name) {
  if (name == "llama-1b") return Llama3Shape(2048, 8192, 16, 64, true, 32.0f);
  if (name == "llama-8b") return Llama3Shape(4096, 14336, 32, 128, false, 8.0f);
  if (name == "qwen3-0.6b") return Qwen3Shape();
  if (name == "tiny") return Tiny();
  if (name == "tiny-qwen3") return TinyQwen3();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown shape \"", name, "\" (llama-1b, llama-8b, qwen3-0.6b, tiny, tiny-qwen3)"));
}

}  // namespace pdserve::bench
