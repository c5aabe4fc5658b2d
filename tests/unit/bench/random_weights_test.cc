// bench/random_weights.h and bench/model_shapes.h: every named shape is a
// valid config; the weights are deterministic per seed, differ across
// seeds, and have the model writer's scale per tensor.
#include "bench/random_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "bench/model_shapes.h"

namespace pdserve::bench {
namespace {

TEST(ModelShapes, EveryNamedShapeIsAValidConfig) {
  for (const char* name : {"llama-1b", "llama-8b", "qwen3-0.6b", "tiny", "tiny-qwen3"}) {
    absl::StatusOr<engine::ModelConfig> c = ModelShape(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_TRUE(engine::ModelConfig::FromJson(c->ToJson()).ok()) << name;
  }
  EXPECT_EQ(ModelShape("llama-1b")->ParameterCount(), 1235814400);   // Llama-3.2-1B
  EXPECT_EQ(ModelShape("llama-8b")->ParameterCount(), 8030261248);   // Llama-3.1-8B
  EXPECT_EQ(ModelShape("qwen3-0.6b")->ParameterCount(), 596049920);  // Qwen3-0.6B
  EXPECT_FALSE(ModelShape("llama-70b").ok());
}

// Mean and standard deviation of a tensor's values.
std::pair<double, double> Moments(const engine::TensorView& t) {
  std::vector<float> v(t.num_elements);
  t.ToF32(v);
  double sum = 0, sq = 0;
  for (float x : v) sum += x;
  const double mean = sum / v.size();
  for (float x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / v.size())};
}

TEST(RandomBf16Weights, SameSeedSameWeightsOtherSeedOtherWeights) {
  const engine::ModelConfig c = *ModelShape("tiny-qwen3");
  auto a = RandomBf16Weights(c, 3), b = RandomBf16Weights(c, 3), d = RandomBf16Weights(c, 4);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  EXPECT_EQ((*a)->fingerprint(), (*b)->fingerprint());
  EXPECT_NE((*a)->fingerprint(), (*d)->fingerprint());
  const engine::TensorView* qa = (*a)->Layer(1, "self_attn.q_proj.weight");
  const engine::TensorView* qb = (*b)->Layer(1, "self_attn.q_proj.weight");
  ASSERT_TRUE(qa != nullptr && qb != nullptr);
  EXPECT_EQ(qa->dtype, engine::StDtype::kBF16);
  ASSERT_EQ(qa->bytes.size(), qb->bytes.size());
  EXPECT_TRUE(std::equal(qa->bytes.begin(), qa->bytes.end(), qb->bytes.begin()));
}

TEST(RandomBf16Weights, TensorsHaveTheModelWritersScale) {
  const engine::ModelConfig c = *ModelShape("tiny");
  auto w = RandomBf16Weights(c, 1);
  ASSERT_TRUE(w.ok()) << w.status();
  const auto [q_mean, q_std] = Moments(*(*w)->Layer(0, "self_attn.q_proj.weight"));
  EXPECT_NEAR(q_mean, 0.0, 0.01);
  EXPECT_NEAR(q_std, 1.0 / std::sqrt(c.hidden_size), 0.05 / std::sqrt(c.hidden_size));
  const auto [d_mean, d_std] = Moments(*(*w)->Layer(0, "mlp.down_proj.weight"));
  EXPECT_NEAR(d_std, 1.0 / std::sqrt(c.intermediate_size), 0.05 / std::sqrt(c.intermediate_size));
  const auto [e_mean, e_std] = Moments(*(*w)->Find("model.embed_tokens.weight"));
  EXPECT_NEAR(e_std, 1.0, 0.05);  // untied: N(0, 1)'s scale
  const auto [n_mean, n_std] = Moments(*(*w)->Layer(0, "input_layernorm.weight"));
  EXPECT_NEAR(n_mean, 1.0, 0.02);
  EXPECT_NEAR(n_std, 0.05, 0.02);
}

}  // namespace
}  // namespace pdserve::bench
