// Loading Llama weights by Hugging Face name, and the model fingerprint.
#include "engine/weights.h"

#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace pdserve::engine {
namespace {

// Points at each tensor of `w` in LlamaWeightSpecs order. W is ModelWeights
// or const ModelWeights.
template <typename W>
auto Destinations(const ModelConfig& config, W& w) {
  std::vector<decltype(&w.embed_tokens)> out = {&w.embed_tokens};
  for (auto& l : w.layers) {
    for (auto* v : {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.post_norm,
                    &l.gate_proj, &l.up_proj, &l.down_proj}) {
      out.push_back(v);
    }
  }
  out.push_back(&w.final_norm);
  if (!config.tie_word_embeddings) out.push_back(&w.lm_head);
  return out;
}

class Fnv1a {
 public:
  void Bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      hash_ ^= p[i];
      hash_ *= 0x100000001b3ull;
    }
  }
  void Int(int64_t v) { Bytes(&v, sizeof(v)); }
  void Float(float v) { Bytes(&v, sizeof(v)); }
  void String(std::string_view s) {
    Int(static_cast<int64_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace

std::vector<WeightSpec> LlamaWeightSpecs(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  std::vector<WeightSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    specs.push_back({p + "input_layernorm.weight", {h}});
    specs.push_back({p + "self_attn.q_proj.weight", {q, h}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    specs.push_back({p + "self_attn.o_proj.weight", {h, q}});
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
    specs.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    specs.push_back({p + "mlp.up_proj.weight", {inter, h}});
    specs.push_back({p + "mlp.down_proj.weight", {h, inter}});
  }
  specs.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

absl::StatusOr<ModelWeights> LoadLlamaWeights(const ModelConfig& config,
                                              const SafetensorsFile& file) {
  ModelWeights w;
  w.layers.resize(static_cast<size_t>(config.num_layers));
  const std::vector<WeightSpec> specs = LlamaWeightSpecs(config);
  const auto dest = Destinations(config, w);
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::StatusOr<std::vector<float>> t = file.ReadF32(specs[i].name, specs[i].shape);
    if (!t.ok()) return t.status();
    *dest[i] = *std::move(t);
  }
  w.fingerprint = ComputeFingerprint(config, w);
  return w;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& config,
                                              const std::string& model_dir) {
  const std::string path = absl::StrCat(model_dir, "/model.safetensors");
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  return LoadLlamaWeights(config, **file);
}

uint64_t ComputeFingerprint(const ModelConfig& c, const ModelWeights& weights) {
  Fnv1a h;
  h.String(c.architecture);
  for (int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
                    c.num_kv_heads, c.head_dim, c.max_position_embeddings}) {
    h.Int(v);
  }
  h.Float(c.rms_norm_eps);
  h.Float(c.rope_theta);
  h.Int(c.tie_word_embeddings ? 1 : 0);

  const std::vector<WeightSpec> specs = LlamaWeightSpecs(c);
  const auto tensors = Destinations(c, weights);  // same order as specs
  constexpr size_t kEdge = 64, kStride = 257;
  for (size_t i = 0; i < specs.size() && i < tensors.size(); ++i) {
    h.String(specs[i].name);
    for (int64_t d : specs[i].shape) h.Int(d);
    const std::vector<float>& t = *tensors[i];
    h.Int(static_cast<int64_t>(t.size()));
    for (size_t j = 0; j < t.size() && j < kEdge; ++j) h.Float(t[j]);
    for (size_t j = kEdge; j + kEdge < t.size(); j += kStride) h.Float(t[j]);
    for (size_t j = t.size() > kEdge ? t.size() - kEdge : t.size(); j < t.size(); ++j) {
      h.Float(t[j]);
    }
  }
  return h.value();
}

}  // namespace pdserve::engine
