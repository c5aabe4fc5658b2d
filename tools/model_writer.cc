// Random checkpoints of every supported architecture; see model_writer.h
// for the initialisation and file layout.
#include "tools/model_writer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "nlohmann/json.hpp"

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
  if (name.ends_with(".bias")) return 0.5;
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

absl::StatusOr<ModelConfig> DemoConfigForArchitecture(std::string_view arch) {
  ModelConfig c = DefaultDemoConfig();
  if (arch == "llama") {
    c.architecture = "LlamaForCausalLM";
  } else if (arch == "mistral") {
    c.architecture = "MistralForCausalLM";
  } else if (arch == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
    c.qkv_bias = true;
  } else if (arch == "qwen3") {
    c.architecture = "Qwen3ForCausalLM";
    c.qk_norm = true;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown architecture \"", std::string(arch),
                                                   "\" (llama, mistral, qwen2 or qwen3)"));
  }
  return c;
}

absl::Status WriteRandomModel(const ModelConfig& config_in, const RandomModelOptions& options,
                              const std::string& out_dir) {
  StDtype st_dtype;
  ModelConfig config = config_in;
  if (options.dtype == "f32") {
    st_dtype = StDtype::kF32;
    config.torch_dtype = "float32";
  } else if (options.dtype == "bf16") {
    st_dtype = StDtype::kBF16;
    config.torch_dtype = "bfloat16";
  } else if (options.dtype == "f16") {
    st_dtype = StDtype::kF16;
    config.torch_dtype = "float16";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype must be f32, bf16 or f16, got \"", options.dtype, "\""));
  }
  // Validate exactly as a reader of config.json will, and write what it reads.
  absl::StatusOr<ModelConfig> parsed = ModelConfig::FromJson(config.ToJson());
  if (!parsed.ok()) return parsed.status();
  config = *std::move(parsed);
  const std::string config_json = config.ToJson();

  const std::vector<WeightSpec> specs = ModelWeightSpecs(config);
  const int num_tensors = static_cast<int>(specs.size());
  if (options.num_shards < 1 || options.num_shards > num_tensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be in [1, ", num_tensors, "], got ", options.num_shards));
  }
  for (int id : options.generation_eos_token_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("generation eos id ", id, " out of range"));
    }
  }
  if (options.generation_bos_token_id >= config.vocab_size) {
    return absl::InvalidArgumentError("generation bos id out of range");
  }

  NormalSource normal(options.seed);
  std::vector<std::vector<float>> data;
  data.reserve(specs.size());
  for (const WeightSpec& spec : specs) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    if (spec.shape.size() == 1 && !spec.name.ends_with(".bias")) {  // norm weights
      for (float& v : values) v = static_cast<float>(1.0 + 0.05 * normal.Next());
    } else {
      const double std_dev = InitStd(config, spec.name, spec.shape);
      for (float& v : values) v = static_cast<float>(std_dev * normal.Next());
    }
    data.push_back(std::move(values));
  }

  // Shard k of N holds a contiguous run of tensors; every shard gets one.
  const int num_shards = options.num_shards;
  const uint64_t elem_bytes = static_cast<uint64_t>(StDtypeBytes(st_dtype));
  uint64_t total_bytes = 0;
  for (const auto& d : data) total_bytes += d.size() * elem_bytes;
  std::vector<int> shard_of(specs.size());
  uint64_t bytes_before = 0;
  for (int i = 0; i < num_tensors; ++i) {
    if (i == 0) {
      shard_of[i] = 0;
    } else {
      const int prev = shard_of[i - 1];
      const int want = static_cast<int>(std::min<uint64_t>(
          num_shards - 1, total_bytes == 0 ? 0 : bytes_before * num_shards / total_bytes));
      const int must = num_shards - (num_tensors - i);  // leave one tensor per later shard
      shard_of[i] = (want > prev || must > prev) && prev + 1 < num_shards ? prev + 1 : prev;
    }
    bytes_before += data[i].size() * elem_bytes;
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  // Stale files of an earlier write would change what a loader picks.
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        name == "generation_config.json" ||
        (name.starts_with("model-") && name.ends_with(".safetensors"))) {
      stale.push_back(entry.path());
    }
  }
  for (const auto& path : stale) std::filesystem::remove(path, ec);
  if (absl::Status s = WriteText(out_dir + "/config.json", config_json + "\n"); !s.ok()) return s;

  if (options.write_generation_config) {
    nlohmann::json g = nlohmann::json::object();
    if (options.generation_bos_token_id >= 0) g["bos_token_id"] = options.generation_bos_token_id;
    if (options.generation_eos_token_ids.size() == 1) {
      g["eos_token_id"] = options.generation_eos_token_ids[0];
    } else if (!options.generation_eos_token_ids.empty()) {
      g["eos_token_id"] = options.generation_eos_token_ids;
    }
    if (absl::Status s = WriteText(out_dir + "/generation_config.json", g.dump(2) + "\n");
        !s.ok()) {
      return s;
    }
  }

  if (num_shards == 1) {
    std::vector<TensorToWrite> tensors;
    tensors.reserve(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      tensors.push_back({specs[i].name, specs[i].shape, data[i]});
    }
    return WriteSafetensors(out_dir + "/model.safetensors", tensors, st_dtype);
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (int k = 0; k < num_shards; ++k) {
    const std::string shard_name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, num_shards);
    std::vector<TensorToWrite> tensors;
    for (int i = 0; i < num_tensors; ++i) {
      if (shard_of[i] != k) continue;
      tensors.push_back({specs[i].name, specs[i].shape, data[i]});
      weight_map[specs[i].name] = shard_name;
    }
    if (absl::Status s = WriteSafetensors(out_dir + "/" + shard_name, tensors, st_dtype); !s.ok()) {
      return s;
    }
  }
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  return WriteText(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed, std::string_view dtype,
                              const std::string& out_dir) {
  RandomModelOptions options;
  options.seed = seed;
  options.dtype = std::string(dtype);
  return WriteRandomModel(config, options, out_dir);
}

}  // namespace pdserve::engine
