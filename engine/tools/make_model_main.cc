// pdserve_make_model: writes a deterministic random-weight Llama checkpoint
// (config.json + model.safetensors) for tests and demos.
//   pdserve_make_model --out_dir=/tmp/tiny --seed=1 [--dtype=bf16] [...]
// Defaults give the demo model of engine/model_writer.h (byte vocabulary).
#include <cstdint>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/model_writer.h"

namespace {
const pdserve::engine::ModelConfig kDemo = pdserve::engine::DefaultDemoConfig();
}  // namespace

ABSL_FLAG(std::string, out_dir, "", "Directory to write config.json and model.safetensors into");
ABSL_FLAG(uint64_t, seed, 1, "Random seed; the same seed gives the same weights");
ABSL_FLAG(int, vocab_size, kDemo.vocab_size, "Vocabulary size (>= 258 for the byte tokenizer)");
ABSL_FLAG(int, hidden_size, kDemo.hidden_size, "Hidden size");
ABSL_FLAG(int, intermediate_size, kDemo.intermediate_size, "MLP intermediate size");
ABSL_FLAG(int, num_layers, kDemo.num_layers, "Decoder layers");
ABSL_FLAG(int, num_heads, kDemo.num_heads, "Attention heads");
ABSL_FLAG(int, num_kv_heads, kDemo.num_kv_heads, "Key/value heads (divides num_heads)");
ABSL_FLAG(int, max_position_embeddings, kDemo.max_position_embeddings, "Context length");
ABSL_FLAG(double, rope_theta, kDemo.rope_theta, "RoPE base");
ABSL_FLAG(bool, tie_word_embeddings, kDemo.tie_word_embeddings, "Share embeddings and LM head");
ABSL_FLAG(std::string, dtype, "f32", "Checkpoint dtype: f32 or bf16");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  if (out_dir.empty()) {
    std::cerr << "pdserve_make_model: --out_dir is required\n";
    return 2;
  }
  pdserve::engine::ModelConfig config = kDemo;
  config.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  config.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  config.intermediate_size = absl::GetFlag(FLAGS_intermediate_size);
  config.num_layers = absl::GetFlag(FLAGS_num_layers);
  config.num_heads = absl::GetFlag(FLAGS_num_heads);
  config.num_kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  // 0 lets config validation report a hidden size the heads do not divide.
  config.head_dim = config.num_heads > 0 && config.hidden_size % config.num_heads == 0
                        ? config.hidden_size / config.num_heads
                        : 0;
  config.max_position_embeddings = absl::GetFlag(FLAGS_max_position_embeddings);
  config.rope_theta = static_cast<float>(absl::GetFlag(FLAGS_rope_theta));
  config.tie_word_embeddings = absl::GetFlag(FLAGS_tie_word_embeddings);
  // BOS/EOS only where the vocabulary has room for them.
  if (config.vocab_size <= kDemo.eos_token_ids[0]) {
    config.bos_token_id = -1;
    config.eos_token_ids.clear();
  }

  absl::Status status = pdserve::engine::WriteRandomModel(config, absl::GetFlag(FLAGS_seed),
                                                          absl::GetFlag(FLAGS_dtype), out_dir);
  if (!status.ok()) {
    std::cerr << "pdserve_make_model: " << status << "\n";
    return 1;
  }
  std::cout << "wrote " << out_dir << "/config.json and model.safetensors\n";
  return 0;
}
