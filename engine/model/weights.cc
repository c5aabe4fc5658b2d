// Loading decoder weights by Hugging Face name, and the model fingerprint.
#include "engine/model/weights.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pdserve::engine {
namespace {

// Calls fn(name, shape, tensor) for every tensor `c` needs, in
// ModelWeightSpecs order. W is ModelWeights or const ModelWeights; `w.layers`
// must already hold c.num_layers entries. The one place the table lives.
template <typename W, typename Fn>
void ForEachTensor(const ModelConfig& c, W& w, Fn&& fn) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  const int64_t d = c.head_dim;
  fn(std::string("model.embed_tokens.weight"), std::vector<int64_t>{c.vocab_size, h},
     w.embed_tokens);
  for (int i = 0; i < c.num_layers; ++i) {
    auto& l = w.layers[static_cast<size_t>(i)];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    fn(p + "input_layernorm.weight", std::vector<int64_t>{h}, l.input_norm);
    fn(p + "self_attn.q_proj.weight", std::vector<int64_t>{q, h}, l.q_proj);
    if (c.qkv_bias) fn(p + "self_attn.q_proj.bias", std::vector<int64_t>{q}, l.q_bias);
    fn(p + "self_attn.k_proj.weight", std::vector<int64_t>{kv, h}, l.k_proj);
    if (c.qkv_bias) fn(p + "self_attn.k_proj.bias", std::vector<int64_t>{kv}, l.k_bias);
    fn(p + "self_attn.v_proj.weight", std::vector<int64_t>{kv, h}, l.v_proj);
    if (c.qkv_bias) fn(p + "self_attn.v_proj.bias", std::vector<int64_t>{kv}, l.v_bias);
    fn(p + "self_attn.o_proj.weight", std::vector<int64_t>{h, q}, l.o_proj);
    if (c.o_bias) fn(p + "self_attn.o_proj.bias", std::vector<int64_t>{h}, l.o_bias);
    if (c.qk_norm) {
      fn(p + "self_attn.q_norm.weight", std::vector<int64_t>{d}, l.q_norm);
      fn(p + "self_attn.k_norm.weight", std::vector<int64_t>{d}, l.k_norm);
    }
    fn(p + "post_attention_layernorm.weight", std::vector<int64_t>{h}, l.post_norm);
    fn(p + "mlp.gate_proj.weight", std::vector<int64_t>{inter, h}, l.gate_proj);
    fn(p + "mlp.up_proj.weight", std::vector<int64_t>{inter, h}, l.up_proj);
    fn(p + "mlp.down_proj.weight", std::vector<int64_t>{h, inter}, l.down_proj);
  }
  fn(std::string("model.norm.weight"), std::vector<int64_t>{h}, w.final_norm);
  if (!c.tie_word_embeddings) {
    fn(std::string("lm_head.weight"), std::vector<int64_t>{c.vocab_size, h}, w.lm_head);
  }
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

std::vector<WeightSpec> ModelWeightSpecs(const ModelConfig& c) {
  std::vector<WeightSpec> specs;
  ModelWeights unused;
  unused.layers.resize(static_cast<size_t>(std::max(c.num_layers, 0)));
  ForEachTensor(c, unused, [&](std::string name, std::vector<int64_t> shape, std::vector<float>&) {
    specs.push_back({std::move(name), std::move(shape)});
  });
  return specs;
}

absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config,
                                         const SafetensorsCheckpoint& checkpoint) {
  ModelWeights w;
  w.layers.resize(static_cast<size_t>(config.num_layers));
  absl::Status status;
  ForEachTensor(
      config, w,
      [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& dest) {
        if (!status.ok()) return;
        absl::StatusOr<std::vector<float>> t = checkpoint.ReadF32(name, shape);
        if (!t.ok()) {
          status = t.status();
          return;
        }
        dest = *std::move(t);
      });
  if (!status.ok()) return status;
  w.fingerprint = ComputeFingerprint(config, w);
  return w;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& config,
                                              const std::string& model_dir) {
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> checkpoint =
      SafetensorsCheckpoint::Open(model_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  return LoadWeights(config, **checkpoint);
}

namespace {

// The config's shape- and math-defining fields.
void HashConfig(const ModelConfig& c, Fnv1a& h) {
  h.String(c.architecture);
  for (int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
                    c.num_kv_heads, c.head_dim, c.max_position_embeddings}) {
    h.Int(v);
  }
  h.Float(c.rms_norm_eps);
  h.Float(c.rope_theta);
  h.Int(c.tie_word_embeddings ? 1 : 0);
  h.Int((c.qkv_bias ? 1 : 0) | (c.o_bias ? 2 : 0) | (c.qk_norm ? 4 : 0));
  h.Int(c.sliding_window);
  h.Int(static_cast<int64_t>(c.rope_scaling.type));
  if (c.rope_scaling.type != RopeScaling::Type::kNone) {
    h.Float(c.rope_scaling.factor);
    h.Float(c.rope_scaling.low_freq_factor);
    h.Float(c.rope_scaling.high_freq_factor);
    h.Int(c.rope_scaling.original_max_position_embeddings);
  }
}

// A tensor's name, shape, size and a sample of its values: the first and
// last 64 and every 257th one.
template <typename At>
void HashTensor(const std::string& name, const std::vector<int64_t>& shape, int64_t n, At at,
                Fnv1a& h) {
  constexpr int64_t kEdge = 64, kStride = 257;
  h.String(name);
  for (int64_t d : shape) h.Int(d);
  h.Int(n);
  for (int64_t j = 0; j < n && j < kEdge; ++j) h.Float(at(j));
  for (int64_t j = kEdge; j + kEdge < n; j += kStride) h.Float(at(j));
  for (int64_t j = n > kEdge ? n - kEdge : n; j < n; ++j) h.Float(at(j));
}

}  // namespace

uint64_t ConfigFingerprint(const ModelConfig& c) {
  Fnv1a h;
  HashConfig(c, h);
  return h.value();
}

uint64_t ComputeFingerprint(const ModelConfig& c, const ModelWeights& weights) {
  Fnv1a h;
  HashConfig(c, h);
  if (weights.layers.size() != static_cast<size_t>(c.num_layers)) {
    h.Int(-1);  // does not fit the config: no tensor walk
    return h.value();
  }
  ForEachTensor(
      c, weights,
      [&](const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& t) {
        HashTensor(
            name, shape, static_cast<int64_t>(t.size()), [&t](int64_t j) { return t[j]; }, h);
      });
  return h.value();
}

uint64_t ComputeFingerprint(const ModelConfig& c, std::span<const FingerprintTensor> tensors) {
  Fnv1a h;
  HashConfig(c, h);
  if (tensors.size() != ModelWeightSpecs(c).size()) {
    h.Int(-1);
    return h.value();
  }
  for (const FingerprintTensor& t : tensors) HashTensor(*t.name, *t.shape, t.size, t.at, h);
  return h.value();
}

}  // namespace pdserve::engine
