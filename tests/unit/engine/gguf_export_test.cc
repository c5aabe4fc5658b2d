// pdserve_export_gguf's writer, read back by a GGUF v3 reader written here
// from the format's description: header, metadata, tensor names, shapes,
// aligned offsets and values (attn_q / attn_k rows interleaved as for
// llama2.c), and the models it refuses. (bench/llamacpp_side_by_side.sh
// checks that llama.cpp and pdserve produce the same greedy tokens.)
#include "tools/gguf_export.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/tiny_models.h"

namespace pdserve::engine {
namespace {

class Reader {
 public:
  explicit Reader(std::vector<char> bytes) : bytes_(std::move(bytes)) {}
  template <typename T>
  T Get() {
    T v{};
    if (at_ + sizeof v > bytes_.size()) {
      failed_ = true;
      return v;
    }
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string String() {
    const uint64_t n = Get<uint64_t>();
    if (failed_ || at_ + n > bytes_.size()) {
      failed_ = true;
      return "";
    }
    std::string s(bytes_.data() + at_, n);
    at_ += n;
    return s;
  }
  size_t at() const { return at_; }
  bool failed() const { return failed_; }
  const std::vector<char>& bytes() const { return bytes_; }

 private:
  std::vector<char> bytes_;
  size_t at_ = 0;
  bool failed_ = false;
};

// One metadata value: scalars as numbers, strings, arrays of strings or
// numbers.
struct Value {
  uint32_t type = 0;
  double number = 0;
  std::string text;
  std::vector<std::string> texts;
  std::vector<double> numbers;
};

double Scalar(Reader& r, uint32_t type) {
  switch (type) {
    case 4:
      return r.Get<uint32_t>();
    case 5:
      return r.Get<int32_t>();
    case 6:
      return r.Get<float>();
    case 7:
      return r.Get<uint8_t>();
    default:
      ADD_FAILURE() << "value type " << type << " not expected from the writer";
      return 0;
  }
}

struct TensorInfo {
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  uint64_t offset = 0;
};

struct Gguf {
  uint32_t version = 0;
  std::map<std::string, Value> kv;
  std::map<std::string, TensorInfo> tensors;
  std::vector<std::string> order;
  size_t data_start = 0;
  std::vector<char> bytes;
  float At(const std::string& tensor, uint64_t index) const {
    float v;
    std::memcpy(&v, bytes.data() + data_start + tensors.at(tensor).offset + 4 * index, 4);
    return v;
  }
};

Gguf Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Reader r(std::vector<char>(std::istreambuf_iterator<char>(in), {}));
  Gguf g;
  EXPECT_EQ(r.Get<uint32_t>(), 0x46554747u);  // "GGUF"
  g.version = r.Get<uint32_t>();
  const uint64_t tensors = r.Get<uint64_t>(), kvs = r.Get<uint64_t>();
  for (uint64_t i = 0; i < kvs && !r.failed(); ++i) {
    const std::string key = r.String();
    Value v;
    v.type = r.Get<uint32_t>();
    if (v.type == 8) {
      v.text = r.String();
    } else if (v.type == 9) {
      const uint32_t elem = r.Get<uint32_t>();
      const uint64_t n = r.Get<uint64_t>();
      for (uint64_t j = 0; j < n && !r.failed(); ++j) {
        if (elem == 8) {
          v.texts.push_back(r.String());
        } else {
          v.numbers.push_back(Scalar(r, elem));
        }
      }
    } else {
      v.number = Scalar(r, v.type);
    }
    g.kv[key] = v;
  }
  for (uint64_t i = 0; i < tensors && !r.failed(); ++i) {
    const std::string name = r.String();
    TensorInfo t;
    const uint32_t n = r.Get<uint32_t>();
    for (uint32_t d = 0; d < n; ++d) t.dims.push_back(r.Get<uint64_t>());
    t.type = r.Get<uint32_t>();
    t.offset = r.Get<uint64_t>();
    g.tensors[name] = t;
    g.order.push_back(name);
  }
  EXPECT_FALSE(r.failed()) << "file ends early";
  g.data_start = (r.at() + 31) / 32 * 32;
  g.bytes = r.bytes();
  return g;
}

TEST(GgufExportTest, WritesAModelLlamaCppReads) {
  const ModelConfig c = testing_models::TinyGqaConfig();  // untied, 4 heads / 2 KV heads
  const std::string dir = testing_models::WriteTinyModel(c, 7, "f32", "gguf_export");
  absl::StatusOr<ModelWeights> w = LoadModelWeights(c, dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string path = ::testing::TempDir() + "/gguf_export.gguf";
  ASSERT_TRUE(WriteGguf(c, *w, path).ok());
  const Gguf g = Read(path);

  EXPECT_EQ(g.version, 3u);
  EXPECT_EQ(g.kv.at("general.architecture").text, "llama");
  EXPECT_EQ(g.kv.at("llama.block_count").number, c.num_layers);
  EXPECT_EQ(g.kv.at("llama.embedding_length").number, c.hidden_size);
  EXPECT_EQ(g.kv.at("llama.feed_forward_length").number, c.intermediate_size);
  EXPECT_EQ(g.kv.at("llama.attention.head_count").number, c.num_heads);
  EXPECT_EQ(g.kv.at("llama.attention.head_count_kv").number, c.num_kv_heads);
  EXPECT_EQ(g.kv.at("llama.rope.dimension_count").number, c.head_dim);
  EXPECT_FLOAT_EQ(static_cast<float>(g.kv.at("llama.attention.layer_norm_rms_epsilon").number),
                  c.rms_norm_eps);
  EXPECT_EQ(g.kv.at("llama.rope.freq_base").number, c.rope_theta);
  EXPECT_EQ(g.kv.at("tokenizer.ggml.model").text, "llama");
  const Value& tokens = g.kv.at("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.texts.size(), static_cast<size_t>(c.vocab_size));
  EXPECT_EQ(tokens.texts[5], "<5>");
  EXPECT_EQ(g.kv.at("tokenizer.ggml.token_type").numbers[kGgufBosId], 3);  // control
  EXPECT_EQ(g.kv.at("tokenizer.ggml.bos_token_id").number, kGgufBosId);

  // Untied: embedding, final norm, LM head, nine tensors per layer.
  ASSERT_EQ(g.tensors.size(), static_cast<size_t>(3 + 9 * c.num_layers));
  const int64_t h = c.hidden_size;
  const TensorInfo& q = g.tensors.at("blk.1.attn_q.weight");
  EXPECT_EQ(q.dims, (std::vector<uint64_t>{static_cast<uint64_t>(h),
                                           static_cast<uint64_t>(c.num_heads * c.head_dim)}));
  EXPECT_EQ(g.tensors.at("blk.0.ffn_down.weight").dims,
            (std::vector<uint64_t>{static_cast<uint64_t>(c.intermediate_size),
                                   static_cast<uint64_t>(h)}));
  uint64_t end = 0;
  for (const std::string& name : g.order) {
    const TensorInfo& t = g.tensors.at(name);
    EXPECT_EQ(t.type, 0u) << name;  // F32
    EXPECT_EQ(t.offset % 32, 0u) << name;
    EXPECT_GE(t.offset, end) << name;
    uint64_t n = 4;
    for (uint64_t d : t.dims) n *= d;
    end = t.offset + n;
  }
  EXPECT_EQ(g.bytes.size(), g.data_start + (end + 31) / 32 * 32);
  // Values: the embedding and LM head as stored, wv unpermuted, wq row 1 of
  // head 0 from Hugging Face row head_dim / 2, wk likewise.
  EXPECT_EQ(g.At("token_embd.weight", 7), w->embed_tokens[7]);
  EXPECT_EQ(g.At("output.weight", w->lm_head.size() - 1), w->lm_head.back());
  EXPECT_EQ(g.At("blk.1.attn_v.weight", 3), w->layers[1].v_proj[3]);
  EXPECT_EQ(g.At("blk.0.attn_q.weight", h), w->layers[0].q_proj[(c.head_dim / 2) * h]);
  EXPECT_EQ(g.At("blk.1.attn_k.weight", h + 2), w->layers[1].k_proj[(c.head_dim / 2) * h + 2]);
  EXPECT_EQ(g.At("blk.0.ffn_norm.weight", 1), w->layers[0].post_norm[1]);
}

TEST(GgufExportTest, RefusesWhatTheLlamaArchitectureCannotRun) {
  const ModelConfig c = testing_models::TinyGqaConfig();
  EXPECT_TRUE(CheckGgufCompatible(c).ok());
  ModelConfig bias = c;
  bias.qkv_bias = true;
  EXPECT_FALSE(CheckGgufCompatible(bias).ok());
  ModelConfig window = c;
  window.sliding_window = 8;
  EXPECT_FALSE(CheckGgufCompatible(window).ok());
  ModelConfig qwen = c;
  qwen.architecture = "Qwen3ForCausalLM";
  EXPECT_FALSE(CheckGgufCompatible(qwen).ok());
}

}  // namespace
}  // namespace pdserve::engine
