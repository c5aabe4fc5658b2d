#include "engine/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pdserve::engine {
namespace {

using nlohmann::json;

constexpr std::string_view kSupportedArchitectures[] = {"LlamaForCausalLM"};

absl::Status ReadInt(const json& j, const char* key, int* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("config.json: missing \"", key, "\""));
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be an integer"));
  }
  int64_t v = it->get<int64_t>();
  if (v < 0 || v > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" out of range: ", v));
  }
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ReadFloat(const json& j, const char* key, float* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be a number"));
  }
  *out = it->get<float>();
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
  if (std::find(std::begin(kSupportedArchitectures), std::end(kSupportedArchitectures),
                c.architecture) == std::end(kSupportedArchitectures)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: unsupported architecture \"", c.architecture, "\""));
  }
  if (auto s = ReadInt(j, "vocab_size", &c.vocab_size, true); !s.ok()) return s;
  if (auto s = ReadInt(j, "hidden_size", &c.hidden_size, true); !s.ok()) return s;
  if (auto s = ReadInt(j, "intermediate_size", &c.intermediate_size, true); !s.ok()) return s;
  if (auto s = ReadInt(j, "num_hidden_layers", &c.num_layers, true); !s.ok()) return s;
  if (auto s = ReadInt(j, "num_attention_heads", &c.num_heads, true); !s.ok()) return s;
  c.num_kv_heads = c.num_heads;
  if (auto s = ReadInt(j, "num_key_value_heads", &c.num_kv_heads, false); !s.ok()) return s;
  if (auto s = ReadInt(j, "head_dim", &c.head_dim, false); !s.ok()) return s;
  if (auto s = ReadInt(j, "max_position_embeddings", &c.max_position_embeddings, true); !s.ok()) return s;
  if (auto s = ReadFloat(j, "rms_norm_eps", &c.rms_norm_eps); !s.ok()) return s;
  if (auto s = ReadFloat(j, "rope_theta", &c.rope_theta); !s.ok()) return s;
  if (auto s = ReadInt(j, "bos_token_id", &c.bos_token_id, false); !s.ok()) return s;
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) {
    c.tie_word_embeddings = it->get<bool>();
  }
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) {
    c.torch_dtype = it->get<std::string>();
  }
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer()) return absl::InvalidArgumentError("config.json: bad \"eos_token_id\"");
        c.eos_token_ids.push_back(e.get<int>());
      }
    } else if (!it->is_null()) {
      return absl::InvalidArgumentError("config.json: bad \"eos_token_id\"");
    }
  }

  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.num_layers},
                         {"num_attention_heads", c.num_heads},
                         {"num_key_value_heads", c.num_kv_heads},
                         {"max_position_embeddings", c.max_position_embeddings}}) {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat("config.json: \"", name, "\" must be > 0"));
  }
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_heads != 0) {
      return absl::InvalidArgumentError("config.json: hidden_size not divisible by num_attention_heads");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) return absl::InvalidArgumentError("config.json: head_dim must be even (RoPE)");
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        "config.json: num_attention_heads must be a multiple of num_key_value_heads");
  }
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0)) {
    return absl::InvalidArgumentError("config.json: rms_norm_eps and rope_theta must be > 0");
  }
  for (int eos : c.eos_token_ids) {
    if (eos < 0 || eos >= c.vocab_size) return absl::InvalidArgumentError("config.json: eos_token_id out of range");
  }
  if (c.bos_token_id >= c.vocab_size) return absl::InvalidArgumentError("config.json: bos_token_id out of range");
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto config = FromJson(ss.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

std::string ModelConfig::ToJson() const {
  json j;
  j["architectures"] = {architecture};
  j["model_type"] = "llama";
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

bool ModelConfig::IsEos(int token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

int64_t ModelConfig::ParameterCount() const {
  const int64_t h = hidden_size;
  const int64_t per_layer = h * q_size() + 2 * h * kv_size() + int64_t{q_size()} * h +
                            3 * h * intermediate_size + 2 * h;
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
