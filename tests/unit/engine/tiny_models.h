// Tiny Llama configs and helpers for engine tests: models are written with
// WriteRandomModel into testing::TempDir() and loaded like real checkpoints.
#pragma once

#include <string>

#include "engine/model/config.h"
#include "gtest/gtest.h"
#include "tools/model_writer.h"

namespace pdserve::engine::testing_models {

// Grouped-query attention (4 heads share 2 KV heads), separate LM head.
inline ModelConfig TinyGqaConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 160;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// Multi-head attention (kv_heads == heads), tied embeddings, other sizes.
inline ModelConfig TinyTiedConfig() {
  ModelConfig c = TinyGqaConfig();
  c.vocab_size = 300;
  c.hidden_size = 48;
  c.intermediate_size = 96;
  c.num_heads = 3;
  c.num_kv_heads = 3;
  c.head_dim = 16;
  c.rope_theta = 500.0f;  // faster rotation: position errors show sooner
  c.tie_word_embeddings = true;
  return c;
}

// The demo model's vocabulary (320 ids: the demo tokenizer's bytes,
// specials and merges, tools/tokenizer_writer.h) on a tiny network.
inline ModelConfig TinyDemoConfig() {
  ModelConfig c = DefaultDemoConfig();
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 256;
  return c;
}

// Writes the model once per directory name and returns its path.
inline std::string WriteTinyModel(const ModelConfig& config, uint64_t seed,
                                  const std::string& dtype, const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  absl::Status s = WriteRandomModel(config, seed, dtype, dir);
  EXPECT_TRUE(s.ok()) << s;
  return dir;
}

}  // namespace pdserve::engine::testing_models
