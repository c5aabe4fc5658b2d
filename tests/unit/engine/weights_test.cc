// Weight loading by Hugging Face name, shape checks and the fingerprint;
// CreateModelRunner option handling.
#include "engine/weights.h"

#include <string>
#include <vector>

#include "engine/runner_factory.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/tiny_models.h"

namespace pdserve::engine {
namespace {

using ::testing::HasSubstr;
using testing_models::TinyGqaConfig;
using testing_models::TinyTiedConfig;
using testing_models::WriteTinyModel;

// Rewrites `dir`/model.safetensors without tensor `drop`.
void DropTensor(const std::string& dir, const std::string& drop) {
  const std::string path = dir + "/model.safetensors";
  std::vector<std::vector<float>> data;
  std::vector<TensorToWrite> keep;
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok());
    for (const std::string& name : (*file)->names()) {
      if (name == drop) continue;
      const TensorInfo* info = (*file)->Find(name);
      data.push_back(*(*file)->ReadF32(name, info->shape));
      keep.push_back({name, info->shape, {}});
    }
  }
  for (size_t i = 0; i < keep.size(); ++i) keep[i].data = data[i];
  ASSERT_TRUE(WriteSafetensors(path, keep, StDtype::kF32).ok());
}

TEST(WeightsTest, LoadsAllTensorsWithShapes) {
  const ModelConfig c = TinyGqaConfig();
  const std::string dir = WriteTinyModel(c, 1, "f32", "weights_load");
  auto w = LoadModelWeights(c, dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->embed_tokens.size(), size_t{96 * 64});
  EXPECT_EQ(w->lm_head.size(), size_t{96 * 64});
  ASSERT_EQ(w->layers.size(), 2u);
  EXPECT_EQ(w->layers[1].k_proj.size(), size_t{32 * 64});
  EXPECT_EQ(w->layers[1].down_proj.size(), size_t{64 * 160});
  EXPECT_NE(w->fingerprint, 0u);
  EXPECT_EQ(w->fingerprint, ComputeFingerprint(c, *w));
}

TEST(WeightsTest, TiedModelHasNoLmHead) {
  const ModelConfig c = TinyTiedConfig();
  auto w = LoadModelWeights(c, WriteTinyModel(c, 1, "bf16", "weights_tied"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->lm_head.empty());
  EXPECT_EQ(&w->lm_head_or_embed(), &w->embed_tokens);
}

TEST(WeightsTest, FingerprintTracksWeights) {
  const ModelConfig c = TinyGqaConfig();
  auto a1 = LoadModelWeights(c, WriteTinyModel(c, 7, "f32", "fp_a1"));
  auto a2 = LoadModelWeights(c, WriteTinyModel(c, 7, "f32", "fp_a2"));
  auto b = LoadModelWeights(c, WriteTinyModel(c, 8, "f32", "fp_b"));
  auto a_bf16 = LoadModelWeights(c, WriteTinyModel(c, 7, "bf16", "fp_a_bf16"));
  ASSERT_TRUE(a1.ok() && a2.ok() && b.ok() && a_bf16.ok());
  EXPECT_EQ(a1->fingerprint, a2->fingerprint);
  EXPECT_NE(a1->fingerprint, b->fingerprint);
  EXPECT_NE(a1->fingerprint, a_bf16->fingerprint);
  // A change deep inside one tensor, at a sampled index, changes it too.
  ModelWeights changed = *std::move(a1);
  changed.layers[1].up_proj[257 * 3 + 64] += 1.0f;
  EXPECT_NE(ComputeFingerprint(c, changed), a2->fingerprint);
}

TEST(WeightsTest, MissingTensorIsNotFound) {
  const ModelConfig c = TinyGqaConfig();
  const std::string dir = WriteTinyModel(c, 1, "f32", "weights_missing");
  DropTensor(dir, "model.layers.1.mlp.up_proj.weight");
  auto w = LoadModelWeights(c, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.1.mlp.up_proj.weight"));
}

TEST(WeightsTest, UntiedConfigNeedsLmHead) {
  ModelConfig tied = TinyTiedConfig();
  const std::string dir = WriteTinyModel(tied, 1, "f32", "weights_no_head");
  tied.tie_word_embeddings = false;
  auto w = LoadModelWeights(tied, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(w.status().message(), HasSubstr("lm_head.weight"));
}

TEST(WeightsTest, WrongShapeNamesTensorAndShapes) {
  const ModelConfig c = TinyGqaConfig();
  const std::string dir = WriteTinyModel(c, 1, "f32", "weights_shape");
  ModelConfig other = c;
  other.intermediate_size = 100;
  auto w = LoadModelWeights(other, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_THAT(w.status().message(), HasSubstr("[160, 64]"));
  EXPECT_THAT(w.status().message(), HasSubstr("[100, 64]"));
}

TEST(RunnerFactoryTest, BackendsAndKvSizing) {
  const ModelConfig c = TinyGqaConfig();
  RunnerOptions options;
  options.model_dir = WriteTinyModel(c, 1, "f32", "factory");
  options.kv_block_size = 4;
  options.num_threads = 2;

  options.backend = "cuda";
  auto cuda = CreateModelRunner(options);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cuda.status().message(), HasSubstr("cuda backend not built"));
  options.backend = "tpu";
  EXPECT_EQ(CreateModelRunner(options).status().code(), absl::StatusCode::kInvalidArgument);

  options.backend = "cpu";
  options.kv_cache_bytes = 1 << 20;  // 512 B/token (2*2 layers*32*4) * 4 tokens/block
  auto runner = CreateModelRunner(options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->num_kv_blocks(), 512);
  EXPECT_EQ((*runner)->kv_block_size(), 4);
  EXPECT_EQ((*runner)->kv_dtype(), KvDtype::kF32);
  EXPECT_EQ((*runner)->LayerKvBytes(10), size_t{2 * 10 * 32 * 4});

  options.kv_cache_bytes = 1;  // at least one block
  runner = CreateModelRunner(options);
  ASSERT_TRUE(runner.ok());
  EXPECT_EQ((*runner)->num_kv_blocks(), 1);

  options.num_kv_blocks = 9;  // explicit count wins
  runner = CreateModelRunner(options);
  ASSERT_TRUE(runner.ok());
  EXPECT_EQ((*runner)->num_kv_blocks(), 9);

  options.kv_block_size = 0;
  EXPECT_EQ(CreateModelRunner(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.kv_block_size = 4;
  options.model_dir = ::testing::TempDir() + "/no_such_model";
  EXPECT_FALSE(CreateModelRunner(options).ok());
}

}  // namespace
}  // namespace pdserve::engine
