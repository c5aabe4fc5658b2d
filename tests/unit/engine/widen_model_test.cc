// pdserve_widen_model's widening: on every architecture the widened
// checkpoint, loaded as any checkpoint is, gives the source's logits (up to
// summation order) and its greedy tokens, with k times the sizes it widens.
#include "tools/widen_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/model_runner.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/arch_models.h"

namespace pdserve::engine {
namespace {

std::unique_ptr<ModelRunner> Runner(const std::string& dir) {
  RunnerOptions o;
  o.model_dir = dir;
  o.kv_block_size = 4;
  o.num_kv_blocks = 32;
  o.num_threads = 1;
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

std::vector<float> PromptLogits(ModelRunner& runner, const std::vector<int32_t>& prompt) {
  const std::vector<int32_t> table = {0, 1, 2, 3};
  const PrefillSequence seq{prompt, table};
  std::vector<float> logits;
  const absl::Status s = PrefillForLogits(
      runner, {&seq, 1}, [](int) {}, logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

class WidenModelTest : public testing::TestWithParam<testing_models::ArchCase> {};

TEST_P(WidenModelTest, WiderCheckpointGivesTheSourceLogitsAndTokens) {
  const testing_models::ArchCase& arch = GetParam();
  const std::string dir =
      testing_models::WriteTinyModel(arch.config, 7, arch.dtype, "widen_src_" + arch.name);
  {
    std::ofstream extra(dir + "/tokenizer.json");
    extra << "{\"model\": {}}\n";
  }
  for (int k : {2, 4}) {
    const std::string wide_dir =
        ::testing::TempDir() + "/widen_" + arch.name + "_x" + std::to_string(k);
    ASSERT_TRUE(WidenCheckpoint(dir, wide_dir, {.factor = k}).ok());
    ASSERT_TRUE(std::filesystem::exists(wide_dir + "/tokenizer.json"));

    std::unique_ptr<ModelRunner> narrow = Runner(dir);
    std::unique_ptr<ModelRunner> wide = Runner(wide_dir);
    ASSERT_NE(narrow, nullptr);
    ASSERT_NE(wide, nullptr);
    const ModelConfig& a = narrow->config();
    const ModelConfig& b = wide->config();
    EXPECT_EQ(b.hidden_size, k * a.hidden_size);
    EXPECT_EQ(b.intermediate_size, k * a.intermediate_size);
    EXPECT_EQ(b.num_heads, k * a.num_heads);
    EXPECT_EQ(b.num_kv_heads, k * a.num_kv_heads);
    EXPECT_EQ(b.head_dim, a.head_dim);
    EXPECT_EQ(b.vocab_size, a.vocab_size);
    EXPECT_EQ(b.torch_dtype, a.torch_dtype);
    EXPECT_GT(wide->DecodeWeightBytes(), (k * k - 1) * narrow->DecodeWeightBytes() / 2);

    std::vector<int32_t> prompt;
    for (int i = 0; i < 11; ++i) prompt.push_back((i * 37 + 5) % a.vocab_size);
    const std::vector<float> want = PromptLogits(*narrow, prompt);
    const std::vector<float> got = PromptLogits(*wide, prompt);
    ASSERT_EQ(got.size(), want.size());
    double scale = 1, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::abs(want[i])));
      diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
    }
    EXPECT_LT(diff / scale, 1e-4) << "k " << k;

    SamplingParams params;
    params.temperature = 0.0f;
    params.max_tokens = 12;
    params.ignore_eos = true;
    absl::StatusOr<GenerateResult> x = GenerateLocally(*narrow, prompt, params);
    absl::StatusOr<GenerateResult> y = GenerateLocally(*wide, prompt, params);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(y->tokens, x->tokens) << "k " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, WidenModelTest, testing::ValuesIn(testing_models::AllArchCases()),
                         [](const testing::TestParamInfo<testing_models::ArchCase>& info) {
                           return info.param.name;
                         });

TEST(WidenModelErrorsTest, RefusesWhatItCannotWiden) {
  const std::string dir =
      testing_models::WriteTinyModel(testing_models::TinyGqaConfig(), 3, "f32", "widen_errors");
  const std::string out = ::testing::TempDir() + "/widen_errors_out";
  EXPECT_EQ(WidenCheckpoint(dir, out, {.factor = 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WidenCheckpoint(dir, out, {.factor = 65}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WidenCheckpoint(dir, out, {.factor = 2, .dtype = "int3"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WidenCheckpoint(dir, dir, {.factor = 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WidenCheckpoint(dir + "/missing", out, {.factor = 2}).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve::engine
