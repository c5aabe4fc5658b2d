// Random Llama checkpoints; see model_writer.h for the initialisation.
#include "engine/model_writer.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace pdserve::engine {
namespace {

// Standard normal draws from a 64-bit Mersenne Twister via Box-Muller; both
// outputs of each transform are used.
class NormalSource {
 public:
  explicit NormalSource(uint64_t seed) : rng_(seed) {}

  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1] so log(u1) is finite; u2 in [0, 1). 53 random bits each.
    const double u1 = (static_cast<double>(rng_() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::mt19937_64 rng_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Standard deviation of tensor `name` with `shape` (see model_writer.h).
double InitStd(const ModelConfig& config, const std::string& name,
               const std::vector<int64_t>& shape) {
  if (name == "model.embed_tokens.weight") {
    return config.tie_word_embeddings ? 1.0 / std::sqrt(static_cast<double>(config.hidden_size))
                                      : 1.0;
  }
  return 1.0 / std::sqrt(static_cast<double>(shape.back()));  // 1/sqrt(in_features)
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

ModelConfig DefaultDemoConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 320;
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.num_layers = 4;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = c.hidden_size / c.num_heads;
  c.max_position_embeddings = 1024;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tie_word_embeddings = false;
  c.bos_token_id = 256;
  c.eos_token_ids = {257};
  return c;
}

absl::Status WriteRandomModel(const ModelConfig& config_in, uint64_t seed, std::string_view dtype,
                              const std::string& out_dir) {
  StDtype st_dtype;
  ModelConfig config = config_in;
  if (dtype == "f32") {
    st_dtype = StDtype::kF32;
    config.torch_dtype = "float32";
  } else if (dtype == "bf16") {
    st_dtype = StDtype::kBF16;
    config.torch_dtype = "bfloat16";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype must be f32 or bf16, got \"", std::string(dtype), "\""));
  }
  // Validate exactly as a reader of config.json will.
  const std::string config_json = config.ToJson();
  if (absl::StatusOr<ModelConfig> parsed = ModelConfig::FromJson(config_json); !parsed.ok()) {
    return parsed.status();
  }

  const std::vector<WeightSpec> specs = LlamaWeightSpecs(config);
  NormalSource normal(seed);
  std::vector<std::vector<float>> data;
  data.reserve(specs.size());
  for (const WeightSpec& spec : specs) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    if (spec.shape.size() == 1) {  // norm weights
      for (float& v : values) v = static_cast<float>(1.0 + 0.05 * normal.Next());
    } else {
      const double std_dev = InitStd(config, spec.name, spec.shape);
      for (float& v : values) v = static_cast<float>(std_dev * normal.Next());
    }
    data.push_back(std::move(values));
  }
  std::vector<TensorToWrite> tensors;
  tensors.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    tensors.push_back({specs[i].name, specs[i].shape, data[i]});
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  if (absl::Status s = WriteText(out_dir + "/config.json", config_json + "\n"); !s.ok()) return s;
  return WriteSafetensors(out_dir + "/model.safetensors", tensors, st_dtype);
}

}  // namespace pdserve::engine
