// pdserve_make_model: writes a deterministic random-weight checkpoint of any
// supported architecture in the Hugging Face layout, for tests, demos,
// benchmarks and the torch reference check (tests/reference/).
//   pdserve_make_model --out_dir=/tmp/tiny [--arch=llama|mistral|qwen2|qwen3]
//       [--seed=1] [--dtype=f32|bf16|f16] [--shards=N] [--rope_scaling=llama3]
//       [--sliding_window=W] [--head_dim=D] [--generation_eos=1,2] [--tokenizer=bpe] [...]
// Defaults give the demo model of tools/model_writer.h (byte vocabulary).
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/cli.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

namespace {
const pdserve::engine::ModelConfig kDemo = pdserve::engine::DefaultDemoConfig();
}  // namespace

ABSL_FLAG(std::string, out_dir, "", "Directory to write the checkpoint into");
ABSL_FLAG(std::string, arch, "llama", "Architecture: llama, mistral, qwen2 or qwen3");
ABSL_FLAG(uint64_t, seed, 1, "Random seed; the same seed gives the same weights");
ABSL_FLAG(int, vocab_size, kDemo.vocab_size, "Vocabulary size (>= 258 for the byte tokenizer)");
ABSL_FLAG(int, hidden_size, kDemo.hidden_size, "Hidden size");
ABSL_FLAG(int, intermediate_size, kDemo.intermediate_size, "MLP intermediate size");
ABSL_FLAG(int, num_layers, kDemo.num_layers, "Decoder layers");
ABSL_FLAG(int, num_heads, kDemo.num_heads, "Attention heads");
ABSL_FLAG(int, num_kv_heads, kDemo.num_kv_heads, "Key/value heads (divides num_heads)");
ABSL_FLAG(int, head_dim, 0, "Per-head size; 0: hidden_size / num_heads");
ABSL_FLAG(int, max_position_embeddings, kDemo.max_position_embeddings, "Context length");
ABSL_FLAG(double, rope_theta, kDemo.rope_theta, "RoPE base");
ABSL_FLAG(double, rms_norm_eps, kDemo.rms_norm_eps, "RMSNorm epsilon");
ABSL_FLAG(bool, tie_word_embeddings, kDemo.tie_word_embeddings, "Share embeddings and LM head");
ABSL_FLAG(bool, attention_bias, false, "llama/qwen3: bias on q/k/v/o projections");
ABSL_FLAG(int, sliding_window, 0, "mistral: attention window in tokens; 0: none");
ABSL_FLAG(std::string, rope_scaling, "", "\"\" (none) or \"llama3\"");
ABSL_FLAG(double, rope_factor, 8.0, "llama3 rope_scaling factor");
ABSL_FLAG(double, rope_low_freq_factor, 1.0, "llama3 rope_scaling low_freq_factor");
ABSL_FLAG(double, rope_high_freq_factor, 4.0, "llama3 rope_scaling high_freq_factor");
ABSL_FLAG(int, rope_original_max_position_embeddings, 64,
          "llama3 rope_scaling original_max_position_embeddings");
ABSL_FLAG(std::string, dtype, "f32", "Checkpoint dtype: f32, bf16 or f16");
ABSL_FLAG(int, shards, 1, "1: model.safetensors; N > 1: N shards plus an index");
ABSL_FLAG(std::string, generation_eos, "",
          "Comma-separated eos ids: writes generation_config.json with them");
ABSL_FLAG(int, generation_bos, -1, "bos id for generation_config.json (-1: omitted)");
ABSL_FLAG(std::string, tokenizer, "byte",
          "byte: no tokenizer files (servers use the byte-level tokenizer); bpe: write "
          "tokenizer.json and tokenizer_config.json with the Llama 3 chat template "
          "(tools/tokenizer_writer.h), and generation_config.json with EOS 257 and 260 unless "
          "--generation_eos says otherwise");

int main(int argc, char** argv) {
  pdserve::ParseFlags(
      argc, argv, "Writes a random-weight model directory in the Hugging Face layout", __FILE__);
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  if (out_dir.empty()) {
    std::cerr << "pdserve_make_model: --out_dir is required\n";
    return 2;
  }
  absl::StatusOr<pdserve::engine::ModelConfig> arch_config =
      pdserve::engine::DemoConfigForArchitecture(absl::GetFlag(FLAGS_arch));
  if (!arch_config.ok()) {
    std::cerr << "pdserve_make_model: " << arch_config.status() << "\n";
    return 2;
  }
  pdserve::engine::ModelConfig config = *arch_config;
  config.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  config.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  config.intermediate_size = absl::GetFlag(FLAGS_intermediate_size);
  config.num_layers = absl::GetFlag(FLAGS_num_layers);
  config.num_heads = absl::GetFlag(FLAGS_num_heads);
  config.num_kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  config.head_dim = absl::GetFlag(FLAGS_head_dim);
  // 0 lets config validation report a hidden size the heads do not divide.
  if (config.head_dim == 0) {
    config.head_dim = config.num_heads > 0 && config.hidden_size % config.num_heads == 0
                          ? config.hidden_size / config.num_heads
                          : 0;
  }
  config.max_position_embeddings = absl::GetFlag(FLAGS_max_position_embeddings);
  config.rope_theta = static_cast<float>(absl::GetFlag(FLAGS_rope_theta));
  config.rms_norm_eps = static_cast<float>(absl::GetFlag(FLAGS_rms_norm_eps));
  config.tie_word_embeddings = absl::GetFlag(FLAGS_tie_word_embeddings);
  if (absl::GetFlag(FLAGS_attention_bias)) {
    if (config.architecture != "LlamaForCausalLM" && config.architecture != "Qwen3ForCausalLM") {
      std::cerr << "pdserve_make_model: --attention_bias applies to llama and qwen3 only\n";
      return 2;
    }
    config.qkv_bias = config.o_bias = true;
  }
  if (absl::GetFlag(FLAGS_sliding_window) != 0) {
    if (config.architecture != "MistralForCausalLM") {
      std::cerr << "pdserve_make_model: --sliding_window applies to mistral only\n";
      return 2;
    }
    config.sliding_window = absl::GetFlag(FLAGS_sliding_window);
  }
  const std::string rope = absl::GetFlag(FLAGS_rope_scaling);
  if (rope == "llama3") {
    config.rope_scaling.type = pdserve::engine::RopeScaling::Type::kLlama3;
    config.rope_scaling.factor = static_cast<float>(absl::GetFlag(FLAGS_rope_factor));
    config.rope_scaling.low_freq_factor =
        static_cast<float>(absl::GetFlag(FLAGS_rope_low_freq_factor));
    config.rope_scaling.high_freq_factor =
        static_cast<float>(absl::GetFlag(FLAGS_rope_high_freq_factor));
    config.rope_scaling.original_max_position_embeddings =
        absl::GetFlag(FLAGS_rope_original_max_position_embeddings);
  } else if (!rope.empty()) {
    std::cerr << "pdserve_make_model: --rope_scaling must be empty or llama3\n";
    return 2;
  }
  // BOS/EOS only where the vocabulary has room for them.
  if (config.vocab_size <= kDemo.eos_token_ids[0]) {
    config.bos_token_id = -1;
    config.eos_token_ids.clear();
  }

  pdserve::engine::RandomModelOptions options;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.dtype = absl::GetFlag(FLAGS_dtype);
  options.num_shards = absl::GetFlag(FLAGS_shards);
  const std::string tokenizer = absl::GetFlag(FLAGS_tokenizer);
  if (tokenizer != "byte" && tokenizer != "bpe") {
    std::cerr << "pdserve_make_model: --tokenizer must be byte or bpe\n";
    return 2;
  }
  std::string eos = absl::GetFlag(FLAGS_generation_eos);
  if (tokenizer == "bpe" && eos.empty()) {
    eos = absl::StrCat(pdserve::engine::kDemoEndOfTextId, ",", pdserve::engine::kDemoEotId);
  }
  options.generation_bos_token_id = absl::GetFlag(FLAGS_generation_bos);
  if (!eos.empty() || options.generation_bos_token_id >= 0) {
    options.write_generation_config = true;
    for (absl::string_view part : absl::StrSplit(eos, ',', absl::SkipEmpty())) {
      int id = 0;
      if (!absl::SimpleAtoi(part, &id)) {
        std::cerr << "pdserve_make_model: --generation_eos: bad id \"" << part << "\"\n";
        return 2;
      }
      options.generation_eos_token_ids.push_back(id);
    }
  }

  absl::Status status = pdserve::engine::WriteRandomModel(config, options, out_dir);
  if (!status.ok()) {
    std::cerr << "pdserve_make_model: " << status << "\n";
    return 1;
  }
  if (tokenizer == "bpe") {
    status = pdserve::engine::WriteDemoTokenizer(config.vocab_size, out_dir);
    if (!status.ok()) {
      std::cerr << "pdserve_make_model: " << status << "\n";
      return 1;
    }
  }
  std::cout << "wrote " << config.architecture << " model to " << out_dir << "\n";
  return 0;
}
