// pdserve_export_llama2c's writer: the file layout run.c reads, the q/k row
// interleaving that maps Hugging Face's rotate-half RoPE onto run.c's
// interleaved pairs, and the models it refuses. (bench/llama2c_side_by_side.sh
// also checks that run.c and pdserve produce the same greedy tokens.)
#include "tools/llama2c_export.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/tiny_models.h"

namespace pdserve::engine {
namespace {

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
T At(const std::vector<char>& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

// Hugging Face RoPE (rotate-half) of one head, position p, theta 10000.
std::vector<double> RotateHalf(const std::vector<double>& x, int p) {
  const int d = static_cast<int>(x.size()), half = d / 2;
  std::vector<double> y(x.size());
  for (int j = 0; j < half; ++j) {
    const double a = p * std::pow(10000.0, -2.0 * j / d);
    y[j] = x[j] * std::cos(a) - x[j + half] * std::sin(a);
    y[j + half] = x[j + half] * std::cos(a) + x[j] * std::sin(a);
  }
  return y;
}

// run.c's RoPE: pairs (2j, 2j + 1) rotated by the same angles.
std::vector<double> RotateInterleaved(const std::vector<double>& x, int p) {
  const int d = static_cast<int>(x.size());
  std::vector<double> y(x.size());
  for (int j = 0; j < d / 2; ++j) {
    const double a = p * std::pow(10000.0, -2.0 * j / d);
    y[2 * j] = x[2 * j] * std::cos(a) - x[2 * j + 1] * std::sin(a);
    y[2 * j + 1] = x[2 * j] * std::sin(a) + x[2 * j + 1] * std::cos(a);
  }
  return y;
}

TEST(Llama2cExportTest, InterleavedRowsGiveTheSameAttentionScores) {
  const int heads = 2, d = 8, cols = 3;
  std::vector<float> wq(heads * d * cols), wk(heads * d * cols);
  for (size_t i = 0; i < wq.size(); ++i) {
    wq[i] = std::sin(0.7f * i + 1);
    wk[i] = std::cos(1.3f * i);
  }
  const std::vector<float> pq = InterleaveRopeRows(wq, heads, d, cols);
  const std::vector<float> pk = InterleaveRopeRows(wk, heads, d, cols);
  const std::vector<float> x = {0.5f, -1.0f, 2.0f};
  const auto project = [&](const std::vector<float>& w, int head) {
    std::vector<double> y(d);
    for (int r = 0; r < d; ++r) {
      for (int c = 0; c < cols; ++c) y[r] += double{w[(head * d + r) * cols + c]} * x[c];
    }
    return y;
  };
  for (int head = 0; head < heads; ++head) {
    for (int pq_pos : {0, 3, 17}) {
      for (int pk_pos : {0, 5}) {
        const std::vector<double> hq = RotateHalf(project(wq, head), pq_pos);
        const std::vector<double> hk = RotateHalf(project(wk, head), pk_pos);
        const std::vector<double> iq = RotateInterleaved(project(pq, head), pq_pos);
        const std::vector<double> ik = RotateInterleaved(project(pk, head), pk_pos);
        double hf = 0, l2c = 0;
        for (int i = 0; i < d; ++i) {
          hf += hq[i] * hk[i];
          l2c += iq[i] * ik[i];
        }
        EXPECT_NEAR(hf, l2c, 1e-9) << head << " " << pq_pos << " " << pk_pos;
      }
    }
  }
}

TEST(Llama2cExportTest, WritesTheLayoutRunCReads) {
  const ModelConfig c = testing_models::TinyGqaConfig();  // untied, 4 heads / 2 KV heads
  const std::string dir = testing_models::WriteTinyModel(c, 7, "f32", "llama2c_export");
  absl::StatusOr<ModelWeights> w = LoadModelWeights(c, dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string path = ::testing::TempDir() + "/llama2c_export.bin";
  ASSERT_TRUE(WriteLlama2cCheckpoint(c, *w, path).ok());
  const std::vector<char> bytes = ReadFile(path);

  const int64_t h = c.hidden_size, kv = c.kv_size(), in = c.intermediate_size, l = c.num_layers;
  const int64_t floats = c.vocab_size * h + l * (2 * h + h * h + 2 * kv * h + h * h + 3 * in * h) +
                         h + int64_t{c.max_position_embeddings} * c.head_dim + c.vocab_size * h;
  ASSERT_EQ(bytes.size(), static_cast<size_t>(7 * 4 + floats * 4));
  const int32_t want_header[] = {
      c.hidden_size, c.intermediate_size,      c.num_layers, c.num_heads, c.num_kv_heads,
      -c.vocab_size, c.max_position_embeddings};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(At<int32_t>(bytes, 4 * i), want_header[i]) << i;
  // The embedding first, the untied LM head last, wv unpermuted in between.
  EXPECT_EQ(At<float>(bytes, 28), w->embed_tokens[0]);
  EXPECT_EQ(At<float>(bytes, bytes.size() - 4), w->lm_head.back());
  const size_t wv = 28 + 4 * (c.vocab_size * h + l * h + l * h * h + l * kv * h);
  EXPECT_EQ(At<float>(bytes, wv), w->layers[0].v_proj[0]);
  EXPECT_EQ(At<float>(bytes, wv + 4 * kv * h), w->layers[1].v_proj[0]);
  // wq row 1 of head 0 is Hugging Face row head_dim / 2.
  const size_t wq = 28 + 4 * (c.vocab_size * h + l * h);
  EXPECT_EQ(At<float>(bytes, wq + 4 * h), w->layers[0].q_proj[(c.head_dim / 2) * h]);
}

TEST(Llama2cExportTest, RefusesWhatRunCCannotRun) {
  ModelConfig c = testing_models::TinyGqaConfig();
  EXPECT_TRUE(CheckLlama2cCompatible(c).ok());
  ModelConfig bias = c;
  bias.qkv_bias = true;
  EXPECT_FALSE(CheckLlama2cCompatible(bias).ok());
  ModelConfig theta = c;
  theta.rope_theta = 500000.0f;
  EXPECT_FALSE(CheckLlama2cCompatible(theta).ok());
  ModelConfig head_dim = c;
  head_dim.head_dim = 32;
  EXPECT_FALSE(CheckLlama2cCompatible(head_dim).ok());
  ModelConfig qwen = c;
  qwen.architecture = "Qwen3ForCausalLM";
  EXPECT_FALSE(CheckLlama2cCompatible(qwen).ok());
}

}  // namespace
}  // namespace pdserve::engine
