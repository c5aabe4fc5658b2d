// GGUF export; see gguf_export.h for what is written.
#include "tools/gguf_export.h"

#include <cstdint>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/llama2c_export.h"

namespace pdserve::engine {
namespace {

// GGUF value types and tensor types (ggml.h, gguf.h).
enum : uint32_t {
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
};
constexpr uint32_t kGgmlTypeF32 = 0;
constexpr uint64_t kAlignment = 32;  // GGUF's default general.alignment

class Buffer {
 public:
  template <typename T>
  void Put(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof v);
  }
  void String(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void Key(const std::string& key, uint32_t type) {
    String(key);
    Put(type);
  }
  void PadTo(uint64_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
  }
  const std::vector<char>& bytes() const { return bytes_; }

 private:
  std::vector<char> bytes_;
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;  // innermost first
  std::vector<float> values;
};

}  // namespace

absl::Status CheckGgufCompatible(const ModelConfig& c) {
  if (absl::Status s = CheckPlainLlama(c, "llama.cpp's llama architecture"); !s.ok()) return s;
  if (c.vocab_size < 3) {
    return absl::InvalidArgumentError(
        "llama.cpp's llama architecture cannot run this model: vocab_size < 3");
  }
  return absl::OkStatus();
}

absl::Status WriteGguf(const ModelConfig& c, const ModelWeights& w, const std::string& path) {
  if (absl::Status s = CheckGgufCompatible(c); !s.ok()) return s;
  const uint64_t hidden = static_cast<uint64_t>(c.hidden_size);
  std::vector<Tensor> tensors;
  const auto matrix = [&](std::string name, std::vector<float> values, int64_t rows) {
    const uint64_t cols = values.size() / static_cast<uint64_t>(rows);
    tensors.push_back({std::move(name), {cols, static_cast<uint64_t>(rows)}, std::move(values)});
  };
  const auto vector = [&](std::string name, std::vector<float> values) {
    const uint64_t n = values.size();
    tensors.push_back({std::move(name), {n}, std::move(values)});
  };
  matrix("token_embd.weight", w.embed_tokens, c.vocab_size);
  vector("output_norm.weight", w.final_norm);
  if (!w.lm_head.empty()) matrix("output.weight", w.lm_head, c.vocab_size);
  const int64_t q_rows = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_rows = int64_t{c.num_kv_heads} * c.head_dim;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string b = absl::StrCat("blk.", i, ".");
    vector(b + "attn_norm.weight", l.input_norm);
    matrix(b + "attn_q.weight",
           InterleaveRopeRows(l.q_proj, c.num_heads, c.head_dim, c.hidden_size), q_rows);
    matrix(b + "attn_k.weight",
           InterleaveRopeRows(l.k_proj, c.num_kv_heads, c.head_dim, c.hidden_size), kv_rows);
    matrix(b + "attn_v.weight", l.v_proj, kv_rows);
    matrix(b + "attn_output.weight", l.o_proj, c.hidden_size);
    vector(b + "ffn_norm.weight", l.post_norm);
    matrix(b + "ffn_gate.weight", l.gate_proj, c.intermediate_size);
    matrix(b + "ffn_up.weight", l.up_proj, c.intermediate_size);
    matrix(b + "ffn_down.weight", l.down_proj, c.hidden_size);
  }

  Buffer kv;
  uint64_t kv_count = 0;
  const auto u32 = [&](const std::string& key, uint64_t v) {
    kv.Key(key, kU32);
    kv.Put(static_cast<uint32_t>(v));
    ++kv_count;
  };
  const auto f32 = [&](const std::string& key, float v) {
    kv.Key(key, kF32);
    kv.Put(v);
    ++kv_count;
  };
  const auto str = [&](const std::string& key, const std::string& v) {
    kv.Key(key, kString);
    kv.String(v);
    ++kv_count;
  };
  str("general.architecture", "llama");
  str("general.name", "pdserve export");
  u32("general.file_type", 0);  // LLAMA_FTYPE_ALL_F32
  u32("llama.context_length", c.max_position_embeddings);
  u32("llama.embedding_length", hidden);
  u32("llama.block_count", c.num_layers);
  u32("llama.feed_forward_length", c.intermediate_size);
  u32("llama.rope.dimension_count", c.head_dim);
  u32("llama.attention.head_count", c.num_heads);
  u32("llama.attention.head_count_kv", c.num_kv_heads);
  u32("llama.attention.key_length", c.head_dim);
  u32("llama.attention.value_length", c.head_dim);
  u32("llama.vocab_size", c.vocab_size);
  f32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  f32("llama.rope.freq_base", c.rope_theta);
  str("tokenizer.ggml.model", "llama");
  kv.Key("tokenizer.ggml.tokens", kArray);
  kv.Put(kString);
  kv.Put<uint64_t>(static_cast<uint64_t>(c.vocab_size));
  for (int i = 0; i < c.vocab_size; ++i) kv.String(absl::StrCat("<", i, ">"));
  kv.Key("tokenizer.ggml.scores", kArray);
  kv.Put(kF32);
  kv.Put<uint64_t>(static_cast<uint64_t>(c.vocab_size));
  for (int i = 0; i < c.vocab_size; ++i) kv.Put(0.0f);
  kv.Key("tokenizer.ggml.token_type", kArray);
  kv.Put(kI32);
  kv.Put<uint64_t>(static_cast<uint64_t>(c.vocab_size));
  for (int i = 0; i < c.vocab_size; ++i) {
    // llama_token_type: 1 normal, 2 unknown, 3 control.
    kv.Put<int32_t>(i == 0 ? 2 : (i == kGgufBosId || i == kGgufEosId) ? 3 : 1);
  }
  kv_count += 3;
  u32("tokenizer.ggml.unknown_token_id", 0);
  u32("tokenizer.ggml.bos_token_id", kGgufBosId);
  u32("tokenizer.ggml.eos_token_id", kGgufEosId);
  kv.Key("tokenizer.ggml.add_bos_token", kBool);
  kv.Put<uint8_t>(1);
  kv.Key("tokenizer.ggml.add_eos_token", kBool);
  kv.Put<uint8_t>(0);
  kv_count += 2;

  Buffer head;
  head.Put<uint32_t>(0x46554747);  // "GGUF"
  head.Put<uint32_t>(3);
  head.Put<uint64_t>(tensors.size());
  head.Put<uint64_t>(kv_count);
  Buffer infos;
  uint64_t offset = 0;
  for (const Tensor& t : tensors) {
    infos.String(t.name);
    infos.Put(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) infos.Put(d);
    infos.Put(kGgmlTypeF32);
    infos.Put(offset);
    offset += (t.values.size() * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
  }

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot open ", path));
  const auto write = [&out](const char* p, size_t n) {
    out.write(p, static_cast<std::streamsize>(n));
  };
  write(head.bytes().data(), head.bytes().size());
  write(kv.bytes().data(), kv.bytes().size());
  write(infos.bytes().data(), infos.bytes().size());
  const uint64_t header = head.bytes().size() + kv.bytes().size() + infos.bytes().size();
  const std::vector<char> zeros(kAlignment, 0);
  write(zeros.data(), (kAlignment - header % kAlignment) % kAlignment);
  for (const Tensor& t : tensors) {
    const size_t n = t.values.size() * sizeof(float);
    write(reinterpret_cast<const char*>(t.values.data()), n);
    write(zeros.data(), (kAlignment - n % kAlignment) % kAlignment);
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace pdserve::engine
