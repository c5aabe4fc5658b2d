// The colocated engine (prefill and decode on one runner) in a KV cache too
// small for its requests: growth preempts the newest sequences, which are
// recomputed from their known tokens and resume. Every stream equals one
// process's uninterrupted run of the same request, plain seeded sampling
// and under a JSON Schema (structured output), where the resumed sequence
// is masked from its own history and every reply parses and validates.
#include <memory>
#include <string>
#include <vector>

#include "colocated/colocated_engine.h"
#include "colocated/colocated_metrics.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/unit/engine/tiny_models.h"
#include "tests/util/constrained_output.h"
#include "tests/util/poll.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::colocated {
namespace {

engine::ModelConfig TinyConfig() { return engine::testing_models::TinyDemoConfig(); }

std::unique_ptr<engine::ModelRunner> Runner(const std::string& dir, int blocks) {
  auto r = engine::CreateModelRunner(
      {.model_dir = dir, .kv_block_size = 16, .num_kv_blocks = blocks, .num_threads = 1});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

// The stream's tokens once it finished; empty (with a failure) otherwise.
std::vector<int32_t> Drain(ColocatedStream& stream) {
  std::vector<int32_t> tokens;
  const absl::Time deadline = absl::Now() + pdserve::testing::kGenerousDeadline;
  std::vector<ColocatedOutput> outs;
  while (absl::Now() < deadline) {
    outs.clear();
    stream.Next(absl::Milliseconds(50), &outs);
    for (const ColocatedOutput& o : outs) {
      tokens.insert(tokens.end(), o.tokens.begin(), o.tokens.end());
      if (!o.error.ok()) {
        ADD_FAILURE() << o.error;
        return {};
      }
      if (o.finished) return tokens;
    }
  }
  ADD_FAILURE() << "the stream never ended";
  return {};
}

// Six requests of 20 + up to 90 tokens (42 blocks of 16 in all) in a
// cache of 14 blocks; the parameter: under a JSON Schema or not.
class ColocatedPreemptionTest : public ::testing::TestWithParam<bool> {};

TEST_P(ColocatedPreemptionTest, PreemptedStreamsResumeExactly) {
  const bool constrained = GetParam();
  const std::string dir = ::testing::TempDir() + "/colocated_preemption_model";
  ASSERT_TRUE(engine::WriteRandomModel(TinyConfig(), /*seed=*/4, "f32", dir).ok());
  ASSERT_TRUE(engine::WriteDemoTokenizer(TinyConfig().vocab_size, dir).ok());
  auto grammars = engine::grammar::CreateGrammarCompiler(dir, TinyConfig());
  ASSERT_TRUE(grammars.ok()) << grammars.status();
  const nlohmann::ordered_json schema = pdserve::testing::LongSchema(/*min_tags=*/5);
  const std::string spec = pdserve::testing::SpecOf(schema);
  auto params_of = [&](int r) {
    const engine::SamplingParams plain{
        .temperature = 0.8f, .seed = 11u + r, .max_tokens = 90, .ignore_eos = !constrained};
    return constrained ? pdserve::testing::Constrained(plain, **grammars, spec) : plain;
  };

  std::unique_ptr<engine::ModelRunner> small = Runner(dir, 14);
  ASSERT_NE(small, nullptr);
  prometheus::Registry registry;
  ColocatedMetrics metrics(registry);
  ColocatedEngine engine({.max_running = 8, .kv_headroom_tokens = 8}, small.get(), &metrics);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<ColocatedStream>> streams;
  for (int r = 0; r < 6; ++r) {
    std::vector<int32_t> p;
    for (int t = 0; t < 20; ++t) p.push_back((t * 19 + r * 31 + 5) % 250);
    prompts.push_back(p);
    auto s =
        engine.Submit({.request_id = std::to_string(r), .prompt = p, .sampling = params_of(r)});
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  std::unique_ptr<engine::ModelRunner> reference = Runner(dir, 16);
  ASSERT_NE(reference, nullptr);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> got = Drain(*streams[i]);
    auto expected = engine::GenerateLocally(*reference, prompts[i], params_of(i));
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(got, expected->tokens) << i;
    if (constrained) {
      EXPECT_EQ(expected->finish_reason, engine::FinishReason::kStop) << i;
      EXPECT_EQ(pdserve::testing::ReplyViolation(
                    schema, pdserve::testing::TextOf((*grammars)->vocab(), got)),
                "")
          << i;
    }
  }
  EXPECT_GT(metrics.preemptions.Value(), 0) << "the workload must preempt";
}

INSTANTIATE_TEST_SUITE_P(Sampling, ColocatedPreemptionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "JsonSchema" : "Plain";
                         });

}  // namespace
}  // namespace pdserve::colocated
