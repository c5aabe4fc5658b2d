// ModelConfig: parsing and validation of config.json and
// generation_config.json, serialisation, RoPE frequencies and size figures.
#include "engine/model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pdserve::engine {
namespace {

using nlohmann::json;

struct ArchitectureInfo {
  std::string_view architecture;
  std::string_view model_type;
};
constexpr ArchitectureInfo kArchitectures[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
};

const ArchitectureInfo* FindArchitecture(std::string_view architecture) {
  for (const auto& a : kArchitectures) {
    if (a.architecture == architecture) return &a;
  }
  return nullptr;
}

// Hugging Face's MistralConfig default when the key is absent (null: none).
constexpr int kMistralDefaultSlidingWindow = 4096;
// Hugging Face's Qwen3Config default when "head_dim" is absent.
constexpr int kQwen3DefaultHeadDim = 128;
// Hugging Face's default rms_norm_eps for all four architectures.
constexpr float kDefaultRmsNormEps = 1e-6f;

absl::Status Invalid(std::string_view file, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(file), ": ", what));
}

absl::Status ReadInt(const json& j, const char* key, int* out, bool required,
                     std::string_view file = "config.json") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return Invalid(file, absl::StrCat("missing \"", key, "\""));
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return Invalid(file, absl::StrCat("\"", key, "\" must be an integer"));
  }
  int64_t v = it->get<int64_t>();
  if (v < 0 || v > (int64_t{1} << 31) - 1) {
    return Invalid(file, absl::StrCat("\"", key, "\" out of range: ", v));
  }
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

// Reads an optional number that must fit a finite float.
absl::Status ReadFloat(const json& j, const char* key, float* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return Invalid("config.json", absl::StrCat("\"", key, "\" must be a number"));
  }
  const double v = it->get<double>();
  if (!std::isfinite(v) || std::abs(v) > 3e38) {
    return Invalid("config.json", absl::StrCat("\"", key, "\" out of range"));
  }
  *out = static_cast<float>(v);
  return absl::OkStatus();
}

absl::Status ReadBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return Invalid("config.json", absl::StrCat("\"", key, "\" must be true or false"));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

// Reads an int-or-list token id field ("eos_token_id") into `out`.
absl::Status ReadIdList(const json& j, const char* key, std::vector<int>* out,
                        std::string_view file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  auto one = [&](const json& e) -> absl::Status {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
        e.get<int64_t>() > (int64_t{1} << 31) - 1) {
      return Invalid(file, absl::StrCat("bad \"", key, "\""));
    }
    out->push_back(static_cast<int>(e.get<int64_t>()));
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const auto& e : *it) {
      if (absl::Status s = one(e); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return one(*it);
}

// Parses "rope_scaling" (or transformers v5 "rope_parameters") into `c`.
absl::Status ReadRopeScaling(const json& j, ModelConfig& c) {
  const json* params = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid("config.json", "\"rope_parameters\" must be an object");
    params = &*it;
    if (absl::Status s = ReadFloat(*params, "rope_theta", &c.rope_theta); !s.ok()) return s;
  } else if (auto it2 = j.find("rope_scaling"); it2 != j.end() && !it2->is_null()) {
    if (!it2->is_object()) return Invalid("config.json", "\"rope_scaling\" must be an object");
    params = &*it2;
  }
  if (params == nullptr) return absl::OkStatus();
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {  // "type": older configs
    if (auto it = params->find(key); it != params->end() && !it->is_null()) {
      if (!it->is_string()) {
        return Invalid("config.json", absl::StrCat("rope_scaling \"", key, "\" must be a string"));
      }
      type = it->get<std::string>();
      break;
    }
  }
  if (type == "default") return absl::OkStatus();
  if (type != "llama3") {
    std::string shown = type.substr(0, 64);
    return Invalid("config.json", absl::StrCat("unsupported rope_scaling type \"", shown,
                                               "\" (supported: \"default\", \"llama3\")"));
  }
  RopeScaling& r = c.rope_scaling;
  r.type = RopeScaling::Type::kLlama3;
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (auto it = params->find(key); it == params->end() || it->is_null()) {
      return Invalid("config.json", absl::StrCat("llama3 rope_scaling needs \"", key, "\""));
    }
  }
  for (auto [key, out] : {std::pair{"factor", &r.factor},
                          {"low_freq_factor", &r.low_freq_factor},
                          {"high_freq_factor", &r.high_freq_factor}}) {
    if (absl::Status s = ReadFloat(*params, key, out); !s.ok()) return s;
  }
  if (absl::Status s = ReadInt(*params, "original_max_position_embeddings",
                               &r.original_max_position_embeddings, /*required=*/true);
      !s.ok()) {
    return s;
  }
  if (!(r.factor > 0) || !(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor) ||
      r.original_max_position_embeddings <= 0) {
    return Invalid("config.json",
                   "llama3 rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor "
                   "and original_max_position_embeddings > 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  ModelConfig c;
  auto arch = j.find("architectures");
  if (arch == j.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
    return absl::InvalidArgumentError("config.json: missing \"architectures\"");
  }
  c.architecture = (*arch)[0].get<std::string>();
  if (FindArchitecture(c.architecture) == nullptr) {
    std::string supported;
    for (const auto& a : kArchitectures) {
      absl::StrAppend(&supported, supported.empty() ? "" : ", ", std::string(a.architecture));
    }
    return absl::InvalidArgumentError(absl::StrCat("config.json: unsupported architecture \"",
                                                   c.architecture.substr(0, 100),
                                                   "\" (supported: ", supported, ")"));
  }
  const bool llama = c.architecture == "LlamaForCausalLM";
  const bool mistral = c.architecture == "MistralForCausalLM";
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";

  c.rms_norm_eps = kDefaultRmsNormEps;
  if (auto s = ReadInt(j, "vocab_size", &c.vocab_size, true); !s.ok()) return s;
  if (auto s = ReadInt(j, "hidden_size", &c.hidden_size, true); !s.ok()) return s;
  if (auto s = ReadInt(j, "intermediate_size", &c.intermediate_size, true); !s.ok()) return s;
  if (auto s = ReadInt(j, "num_hidden_layers", &c.num_layers, true); !s.ok()) return s;
  if (auto s = ReadInt(j, "num_attention_heads", &c.num_heads, true); !s.ok()) return s;
  c.num_kv_heads = c.num_heads;
  if (auto s = ReadInt(j, "num_key_value_heads", &c.num_kv_heads, false); !s.ok()) return s;
  if (qwen3) c.head_dim = kQwen3DefaultHeadDim;
  if (auto s = ReadInt(j, "head_dim", &c.head_dim, false); !s.ok()) return s;
  if (auto s = ReadInt(j, "max_position_embeddings", &c.max_position_embeddings, true); !s.ok())
    return s;
  if (auto s = ReadFloat(j, "rms_norm_eps", &c.rms_norm_eps); !s.ok()) return s;
  if (auto s = ReadFloat(j, "rope_theta", &c.rope_theta); !s.ok()) return s;
  if (auto s = ReadRopeScaling(j, c); !s.ok()) return s;
  if (auto s = ReadInt(j, "bos_token_id", &c.bos_token_id, false); !s.ok()) return s;
  if (auto s = ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings); !s.ok()) return s;
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) {
    c.torch_dtype = it->get<std::string>();
  } else if (auto it2 = j.find("dtype"); it2 != j.end() && it2->is_string()) {
    c.torch_dtype = it2->get<std::string>();  // transformers v5 spelling
  }
  if (auto s = ReadIdList(j, "eos_token_id", &c.eos_token_ids, "config.json"); !s.ok()) return s;

  // Features outside the supported math are refused, never ignored.
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "silu") {
      return absl::InvalidArgumentError(
          "config.json: unsupported \"hidden_act\" (only \"silu\" is implemented)");
    }
  }
  bool mlp_bias = false;
  if (auto s = ReadBool(j, "mlp_bias", &mlp_bias); !s.ok()) return s;
  if (mlp_bias)
    return absl::InvalidArgumentError("config.json: \"mlp_bias\": true is not supported");
  if (auto it = j.find("partial_rotary_factor"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 1.0) {
      return absl::InvalidArgumentError(
          "config.json: \"partial_rotary_factor\" != 1 is not supported");
    }
  }
  bool attention_bias = false;
  if (auto s = ReadBool(j, "attention_bias", &attention_bias); !s.ok()) return s;
  if (llama || qwen3) {
    c.qkv_bias = c.o_bias = attention_bias;
  } else if (qwen2) {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v always biased, o never
  }
  c.qk_norm = qwen3;
  if (mistral) {
    // Decision: the window is implemented in attention (CPU runner), with
    // Hugging Face's semantics: query i attends to keys j with
    // i - sliding_window < j <= i. Absent key: HF's default 4096; null: none.
    c.sliding_window = kMistralDefaultSlidingWindow;
    if (auto it = j.find("sliding_window"); it != j.end()) {
      c.sliding_window = 0;
      if (auto s = ReadInt(j, "sliding_window", &c.sliding_window, false); !s.ok()) return s;
    }
  }
  if (qwen2 || qwen3) {
    // Qwen's window applies to some layers only (max_window_layers); no
    // released checkpoint enables it, so it is refused rather than half-done.
    bool use_sliding_window = false;
    if (auto s = ReadBool(j, "use_sliding_window", &use_sliding_window); !s.ok()) return s;
    if (use_sliding_window) {
      return absl::InvalidArgumentError(
          "config.json: \"use_sliding_window\": true is not supported");
    }
  }
  if (auto it = j.find("layer_types"); it != j.end() && it->is_array()) {
    for (const auto& t : *it) {
      if (!t.is_string() || t.get<std::string>() != "full_attention") {
        return absl::InvalidArgumentError(
            "config.json: \"layer_types\" other than \"full_attention\" are not supported");
      }
    }
  }

  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size},
                         {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.num_layers},
                         {"num_attention_heads", c.num_heads},
                         {"num_key_value_heads", c.num_kv_heads},
                         {"max_position_embeddings", c.max_position_embeddings}}) {
    if (v <= 0)
      return absl::InvalidArgumentError(absl::StrCat("config.json: \"", name, "\" must be > 0"));
  }
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_heads != 0) {
      return absl::InvalidArgumentError(
          "config.json: hidden_size not divisible by num_attention_heads");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0)
    return absl::InvalidArgumentError("config.json: head_dim must be even (RoPE)");
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        "config.json: num_attention_heads must be a multiple of num_key_value_heads");
  }
  // Keeps every per-layer size (heads * head_dim, 2 * intermediate, ...) in int.
  constexpr int64_t kMaxDim = int64_t{1} << 28;
  if (int64_t{c.num_heads} * c.head_dim > kMaxDim || int64_t{c.hidden_size} > kMaxDim ||
      int64_t{c.intermediate_size} > kMaxDim) {
    return absl::InvalidArgumentError("config.json: layer sizes out of range");
  }
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0)) {
    return absl::InvalidArgumentError("config.json: rms_norm_eps and rope_theta must be > 0");
  }
  for (int eos : c.eos_token_ids) {
    if (eos < 0 || eos >= c.vocab_size)
      return absl::InvalidArgumentError("config.json: eos_token_id out of range");
  }
  if (c.bos_token_id >= c.vocab_size)
    return absl::InvalidArgumentError("config.json: bos_token_id out of range");
  return c;
}

namespace {

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));
  return ss.str();
}

absl::Status Prefixed(const absl::Status& s, const std::string& path) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  auto config = FromJson(*text);
  if (!config.ok()) return Prefixed(config.status(), path);
  return config;
}

absl::Status ModelConfig::MergeGenerationConfig(std::string_view json_text) {
  constexpr std::string_view kFile = "generation_config.json";
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid(kFile, "not a JSON object");
  std::vector<int> eos;
  if (absl::Status s = ReadIdList(j, "eos_token_id", &eos, kFile); !s.ok()) return s;
  int bos = -1;
  if (absl::Status s = ReadInt(j, "bos_token_id", &bos, false, kFile); !s.ok()) return s;
  for (int id : eos) {
    if (id >= vocab_size) return Invalid(kFile, absl::StrCat("eos_token_id ", id, " out of range"));
  }
  if (bos >= vocab_size) return Invalid(kFile, absl::StrCat("bos_token_id ", bos, " out of range"));
  for (int id : eos) {
    if (!IsEos(id)) eos_token_ids.push_back(id);
  }
  if (bos >= 0) bos_token_id = bos;
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelConfig::FromModelDir(const std::string& model_dir) {
  absl::StatusOr<ModelConfig> config = FromFile(model_dir + "/config.json");
  if (!config.ok()) return config.status();
  const std::string gen_path = model_dir + "/generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(gen_path, ec)) return config;
  absl::StatusOr<std::string> text = ReadTextFile(gen_path);
  if (!text.ok()) return text.status();
  if (absl::Status s = config->MergeGenerationConfig(*text); !s.ok()) return Prefixed(s, gen_path);
  return config;
}

std::string ModelConfig::ToJson() const {
  json j;
  j["architectures"] = {architecture};
  const ArchitectureInfo* info = FindArchitecture(architecture);
  j["model_type"] = info != nullptr ? std::string(info->model_type) : "llama";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", rope_scaling.factor},
          {"low_freq_factor", rope_scaling.low_freq_factor},
          {"high_freq_factor", rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
  }
  if (architecture == "LlamaForCausalLM" || architecture == "Qwen3ForCausalLM") {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = false;
  }
  if (architecture == "MistralForCausalLM") {
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  }
  if (architecture == "Qwen2ForCausalLM" || architecture == "Qwen3ForCausalLM") {
    j["use_sliding_window"] = false;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  return j.dump(2);
}

std::vector<float> ModelConfig::RopeInverseFrequencies() const {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(std::max(half, 0)));
  for (int i = 0; i < half; ++i) {
    // HF: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), fp32.
    inv_freq[i] =
        1.0f / std::pow(rope_theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  }
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLlama3: {
      // HF _compute_llama3_parameters, operation for operation in fp32.
      const RopeScaling& r = rope_scaling;
      const float old_context = static_cast<float>(r.original_max_position_embeddings);
      const float low_freq_wavelen = old_context / r.low_freq_factor;
      const float high_freq_wavelen = old_context / r.high_freq_factor;
      const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
      for (float& f : inv_freq) {
        const float wavelen = two_pi / f;
        // Long wavelengths (low frequencies) are slowed down by `factor`.
        float scaled = wavelen > low_freq_wavelen ? f / r.factor : f;
        const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if (medium) {
          const float smooth = (old_context / wavelen - r.low_freq_factor) /
                               (r.high_freq_factor - r.low_freq_factor);
          scaled = (1.0f - smooth) * scaled / r.factor + smooth * scaled;
        }
        f = scaled;
      }
      break;
    }
  }
  return inv_freq;
}

bool ModelConfig::IsEos(int token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

int64_t ModelConfig::ParameterCount() const {
  const int64_t h = hidden_size;
  int64_t per_layer =
      h * q_size() + 2 * h * kv_size() + int64_t{q_size()} * h + 3 * h * intermediate_size + 2 * h;
  if (qkv_bias) per_layer += q_size() + 2 * int64_t{kv_size()};
  if (o_bias) per_layer += h;
  if (qk_norm) per_layer += 2 * int64_t{head_dim};
  const int64_t embed = int64_t{vocab_size} * h;
  return embed + num_layers * per_layer + h + (tie_word_embeddings ? 0 : embed);
}

double ModelConfig::PrefillFlops(int num_tokens) const {
  const double t = num_tokens;
  const double matmul_params = static_cast<double>(ParameterCount()) -
                               (tie_word_embeddings ? 0.0 : double(vocab_size) * hidden_size);
  // Dense layers on every token; the LM head on the last token only.
  const double dense = 2.0 * t * (matmul_params - double(vocab_size) * hidden_size) +
                       2.0 * double(vocab_size) * hidden_size;
  // QK^T and PV over the causal triangle: 2 * 2 * heads * head_dim * t*(t+1)/2 per layer.
  const double attention = 2.0 * num_layers * double(num_heads) * head_dim * t * (t + 1);
  return dense + attention;
}

}  // namespace pdserve::engine
