// llama2.c checkpoint export; see llama2c_export.h for the format.
#include "tools/llama2c_export.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pdserve::engine {
namespace {

class Writer {
 public:
  explicit Writer(const std::string& path) : out_(path, std::ios::binary | std::ios::trunc) {}
  bool ok() const { return static_cast<bool>(out_); }
  void Ints(std::initializer_list<int32_t> values) {
    for (int32_t v : values) out_.write(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void Floats(const std::vector<float>& values) {
    out_.write(reinterpret_cast<const char*>(values.data()),
               static_cast<std::streamsize>(values.size() * sizeof(float)));
  }
  void Bytes(const std::string& bytes) {
    out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  void Zeros(int64_t n) { Floats(std::vector<float>(static_cast<size_t>(n), 0.0f)); }
  absl::Status Close(const std::string& path) {
    out_.close();
    if (!out_) return absl::InternalError(absl::StrCat("cannot write ", path));
    return absl::OkStatus();
  }

 private:
  std::ofstream out_;
};

}  // namespace

absl::Status CheckPlainLlama(const ModelConfig& c, std::string_view who) {
  const auto no = [who](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(absl::string_view(who.data(), who.size()), " cannot run this model: ", what));
  };
  if (c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM") {
    return no(absl::StrCat("architecture ", c.architecture));
  }
  if (c.qkv_bias || c.o_bias) return no("attention biases");
  if (c.qk_norm) return no("q/k norms");
  if (c.sliding_window > 0) return no("sliding window");
  if (c.rope_scaling.type != RopeScaling::Type::kNone) return no("rope scaling");
  return absl::OkStatus();
}

absl::Status CheckLlama2cCompatible(const ModelConfig& c) {
  if (absl::Status s = CheckPlainLlama(c, "llama2.c"); !s.ok()) return s;
  const auto no = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("llama2.c cannot run this model: ", what));
  };
  if (c.rope_theta != 10000.0f) return no(absl::StrCat("rope_theta ", c.rope_theta, " != 10000"));
  if (c.head_dim * c.num_heads != c.hidden_size) {
    return no(absl::StrCat("head_dim ", c.head_dim, " != hidden_size / num_heads"));
  }
  return absl::OkStatus();
}

std::vector<float> InterleaveRopeRows(const std::vector<float>& w, int num_heads, int head_dim,
                                      int cols) {
  std::vector<float> out(w.size());
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    for (int j = 0; j < half; ++j) {
      for (int p = 0; p < 2; ++p) {
        const int64_t from = int64_t{h} * head_dim + j + p * half;
        const int64_t to = int64_t{h} * head_dim + 2 * j + p;
        std::copy_n(w.begin() + from * cols, cols, out.begin() + to * cols);
      }
    }
  }
  return out;
}

absl::Status WriteLlama2cCheckpoint(const ModelConfig& c, const ModelWeights& w,
                                    const std::string& path) {
  if (absl::Status s = CheckLlama2cCompatible(c); !s.ok()) return s;
  Writer out(path);
  if (!out.ok()) return absl::InternalError(absl::StrCat("cannot open ", path));
  const bool tied = w.lm_head.empty();
  out.Ints({c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads,
            tied ? c.vocab_size : -c.vocab_size, c.max_position_embeddings});
  out.Floats(w.embed_tokens);
  // Each weight kind for every layer in turn.
  const auto each_layer = [&](auto get) {
    for (const LayerWeights& l : w.layers) out.Floats(get(l));
  };
  each_layer([](const LayerWeights& l) { return l.input_norm; });
  each_layer([&](const LayerWeights& l) {
    return InterleaveRopeRows(l.q_proj, c.num_heads, c.head_dim, c.hidden_size);
  });
  each_layer([&](const LayerWeights& l) {
    return InterleaveRopeRows(l.k_proj, c.num_kv_heads, c.head_dim, c.hidden_size);
  });
  each_layer([](const LayerWeights& l) { return l.v_proj; });
  each_layer([](const LayerWeights& l) { return l.o_proj; });
  each_layer([](const LayerWeights& l) { return l.post_norm; });
  each_layer([](const LayerWeights& l) { return l.gate_proj; });
  each_layer([](const LayerWeights& l) { return l.down_proj; });
  each_layer([](const LayerWeights& l) { return l.up_proj; });
  out.Floats(w.final_norm);
  out.Zeros(int64_t{c.max_position_embeddings} * c.head_dim);  // both unused RoPE tables
  if (!tied) out.Floats(w.lm_head);
  return out.Close(path);
}

absl::Status WriteLlama2cTokenizer(int vocab_size, const std::string& path) {
  Writer out(path);
  if (!out.ok()) return absl::InternalError(absl::StrCat("cannot open ", path));
  out.Ints({static_cast<int32_t>(absl::StrCat("<", vocab_size, ">").size())});
  for (int i = 0; i < vocab_size; ++i) {
    const std::string text = absl::StrCat("<", i, ">");
    out.Floats({0.0f});
    out.Ints({static_cast<int32_t>(text.size())});
    out.Bytes(text);
  }
  return out.Close(path);
}

}  // namespace pdserve::engine
