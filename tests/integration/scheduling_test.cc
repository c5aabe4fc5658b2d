// Scheduling end to end on loopback (router, prefill and decode workers as
// real processes): prompts that share a prefix are routed to the prefill
// worker that caches it and computed after the cached part, and decode
// workers that run out of KV blocks preempt and recompute sequences; in both
// cases every stream must equal the same request run in one process, token
// for token, as the client reads it (no gap, no repeat).
#include <filesystem>
#include <set>
#include <thread>

#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "gtest/gtest.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/local_cluster.h"
#include "tools/model_writer.h"

namespace pdserve::testing {
namespace {

class SchedulingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::testing::TempDir() + "/pdserve_scheduling_test_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(work_dir_);
    std::filesystem::create_directories(work_dir_);
    model_dir_ = work_dir_ + "/model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 512;
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/11, "f32", model_dir_).ok());
    auto runner = engine::CreateModelRunner(
        {.model_dir = model_dir_, .num_kv_blocks = 128, .num_threads = 1});
    ASSERT_TRUE(runner.ok()) << runner.status();
    local_ = std::move(*runner);
  }

  // The request as one process generates it.
  std::vector<int32_t> Expected(const std::vector<int32_t>& prompt,
                                const engine::SamplingParams& params) {
    auto expected = engine::GenerateLocally(*local_, prompt, params);
    EXPECT_TRUE(expected.ok()) << expected.status();
    return expected.ok() ? expected->tokens : std::vector<int32_t>{};
  }

  static v1::GenerateRequest Request(const std::vector<int32_t>& prompt,
                                     const engine::SamplingParams& params) {
    v1::GenerateRequest request = TokenRequest(prompt, params.max_tokens);
    request.mutable_sampling()->set_temperature(params.temperature);
    request.mutable_sampling()->set_seed(params.seed);
    request.mutable_sampling()->set_ignore_eos(params.ignore_eos);
    return request;
  }

  static double Metric(Process& p, const std::string& name) {
    auto text = HttpGet(p.metrics_port, "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? MetricValue(*text, name) : -1;
  }

  std::string work_dir_;
  std::string model_dir_;
  std::unique_ptr<engine::ModelRunner> local_;
};

TEST_F(SchedulingTest, SharedPrefixesGoToTheWorkerThatCachesThem) {
  LocalCluster cluster({.model_dir = model_dir_, .work_dir = work_dir_, .num_prefill = 2});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  // A 150-token system prompt (9 full blocks of 16), then a question.
  std::vector<int32_t> system;
  for (int t = 0; t < 150; ++t) system.push_back(1 + (t * 41) % 250);
  const engine::SamplingParams params{
      .temperature = 0.8f, .seed = 17, .max_tokens = 12, .ignore_eos = true};
  std::set<std::string> workers;
  for (int q = 0; q < 5; ++q) {
    std::vector<int32_t> prompt = system;
    for (int t = 0; t < 6 + q; ++t) prompt.push_back(1 + (t * 7 + q * 31) % 250);
    StreamResult got = RunGenerate(*stub, Request(prompt, params));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, Expected(prompt, params)) << "question " << q;
    workers.insert(got.last.timings().prefill_worker());
  }
  // One worker computed the system prompt once; the others found it cached.
  EXPECT_EQ(workers.size(), 1u);
  double hits = 0, queries = 0;
  for (auto& p : cluster.prefill()) {
    hits += Metric(*p, "pdserve_prefix_cache_hits_total");
    queries += Metric(*p, "pdserve_prefix_cache_queries_total");
  }
  EXPECT_EQ(hits, 4 * 144);
  EXPECT_EQ(queries, 5 * 150 + (6 + 7 + 8 + 9 + 10));
}

TEST_F(SchedulingTest, PreemptedStreamsReachTheClientWhole) {
  // 14 blocks of 16 on the decode worker; six requests of 20 + 60 tokens
  // would need 30 whole, and admission takes 2 each (prompt + 8).
  LocalCluster cluster({.model_dir = model_dir_,
                        .work_dir = work_dir_,
                        .decode_flags = {"--num_kv_blocks=14", "--decode_kv_headroom_tokens=8"}});
  ASSERT_TRUE(cluster.Start().ok());
  const engine::SamplingParams params{
      .temperature = 0.7f, .seed = 5, .max_tokens = 60, .ignore_eos = true};
  std::vector<std::vector<int32_t>> prompts(6);
  for (int r = 0; r < 6; ++r) {
    for (int t = 0; t < 20; ++t) prompts[r].push_back(1 + (t * 13 + r * 37) % 250);
  }
  std::vector<StreamResult> results(prompts.size());
  std::vector<std::thread> clients;
  for (size_t r = 0; r < prompts.size(); ++r) {
    clients.emplace_back([&, r] {
      auto stub = cluster.NewClient();
      // A full decode worker refuses new work while preempted sequences
      // wait: clients retry, as real ones would (bounded).
      for (int attempt = 0; attempt < 200; ++attempt) {
        results[r] = RunGenerate(*stub, Request(prompts[r], params));
        if (results[r].status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return;
        absl::SleepFor(absl::Milliseconds(50));
      }
    });
  }
  for (auto& c : clients) c.join();
  for (size_t r = 0; r < prompts.size(); ++r) {
    ASSERT_TRUE(results[r].status.ok()) << r << ": " << results[r].status.error_message();
    EXPECT_EQ(results[r].tokens, Expected(prompts[r], params)) << r;
    EXPECT_EQ(results[r].last.usage().completion_tokens(), 60) << r;
  }
  EXPECT_GT(Metric(*cluster.decode()[0], "pdserve_preemptions_total"), 0);
  EXPECT_EQ(Metric(*cluster.decode()[0], "pdserve_kv_cache_usage_ratio"), 0);
}

}  // namespace
}  // namespace pdserve::testing
