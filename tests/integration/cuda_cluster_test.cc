// A cluster whose prefill and decode workers both run the CUDA backend under
// the CPU emulation gives the same tokens as the emulated CUDA backend in one
// process (engine::GenerateLocally): greedy, and seeded sampling with
// penalties and log-probabilities. The prompt's bf16 KV moves from the
// prefill worker's device cache to the decode worker's (TCP, staged through
// host memory), and the first token comes from the prefill worker's device
// sampler. The workers are test-only variants of the shipped binaries (the
// same mains with engine/cuda/register_emulated_backend.cc linked in), since
// shipped binaries never carry the emulation; their roofline gauges read
// the emulated device's peaks. A second cluster moves the KV with
// --kv_transport=nccl (each worker process owns an emulated GPU, so the pair
// runs NCCL over loopback, the decode worker scattering into its own blocks)
// and must give the tokens of the tcp cluster. A JSON Schema request
// (structured output) is masked on both workers' device samplers.
#include <filesystem>

#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "gtest/gtest.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/local_cluster.h"
#include "tests/util/constrained_output.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::testing {
namespace {

class CudaClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_dir_ = new std::string(::testing::TempDir() + "/pdserve_cuda_cluster_test");
    std::filesystem::remove_all(*work_dir_);
    std::filesystem::create_directories(*work_dir_);
    model_dir_ = new std::string(*work_dir_ + "/model");
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.num_layers = 2;  // the emulation runs every GPU thread on the CPU
    config.max_position_embeddings = 256;
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/17, "bf16", *model_dir_).ok());
    // Structured output compiles grammars over the tokenizer's vocabulary.
    ASSERT_TRUE(engine::WriteDemoTokenizer(config.vocab_size, *model_dir_).ok());
    const std::vector<std::string> worker_flags = {"--backend=cuda", "--num_kv_blocks=64"};
    cluster_ =
        new LocalCluster(ClusterOptions{.binaries = {.prefill = PDSERVE_PREFILL_EMULATED_CUDA_BIN,
                                                     .decode = PDSERVE_DECODE_EMULATED_CUDA_BIN},
                                        .model_dir = *model_dir_,
                                        .work_dir = *work_dir_,
                                        .prefill_flags = worker_flags,
                                        .decode_flags = worker_flags});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  // The emulated CUDA backend in this process (registered by this test's
  // own copy of register_emulated_backend.cc).
  static std::unique_ptr<engine::ModelRunner> LocalRunner() {
    auto runner = engine::CreateModelRunner(
        {.model_dir = *model_dir_, .backend = "cuda", .num_kv_blocks = 64});
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? *std::move(runner) : nullptr;
  }

  static double Metric(Process& p, const std::string& name) {
    auto text = HttpGet(p.metrics_port, "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? MetricValue(*text, name) : -1;
  }

  static std::string* work_dir_;
  static std::string* model_dir_;
  static LocalCluster* cluster_;
};
std::string* CudaClusterTest::work_dir_ = nullptr;
std::string* CudaClusterTest::model_dir_ = nullptr;
LocalCluster* CudaClusterTest::cluster_ = nullptr;

TEST_F(CudaClusterTest, GreedyTokensEqualTheBackendInOneProcess) {
  std::unique_ptr<engine::ModelRunner> runner = LocalRunner();
  ASSERT_NE(runner, nullptr);
  ASSERT_EQ(runner->backend(), "cuda");
  auto stub = cluster_->NewClient();
  const std::vector<std::vector<int32_t>> prompts = {
      {256, 72, 101, 108, 108, 111},
      {1},
      {256, 84, 104, 101, 32,  113, 117, 105, 99,  107,
       32,  98, 114, 111, 119, 110, 32,  102, 111, 120},
      std::vector<int32_t>(33, 65)};
  for (const auto& prompt : prompts) {
    engine::SamplingParams params;
    params.max_tokens = 12;
    auto expected = engine::GenerateLocally(*runner, prompt, params);
    ASSERT_TRUE(expected.ok()) << expected.status();
    StreamResult got = RunGenerate(*stub, TokenRequest(prompt, 12));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, expected->tokens) << "prompt of " << prompt.size() << " tokens";
    EXPECT_EQ(static_cast<int>(got.last.finish_reason()),
              static_cast<int>(expected->finish_reason));
  }
}

TEST_F(CudaClusterTest, SeededSamplingWithPenaltiesAndLogprobsEqualsTheBackendInOneProcess) {
  std::unique_ptr<engine::ModelRunner> runner = LocalRunner();
  ASSERT_NE(runner, nullptr);
  auto stub = cluster_->NewClient();
  const std::vector<int32_t> prompt = {256, 80, 101, 110, 97, 108, 116, 121};
  engine::SamplingParams params{.temperature = 0.8f,
                                .top_k = 40,
                                .top_p = 0.9f,
                                .seed = 5,
                                .max_tokens = 12,
                                .repetition_penalty = 1.3f,
                                .frequency_penalty = 0.3f,
                                .min_tokens = 4,
                                .logprobs = 2};
  auto expected = engine::GenerateLocally(*runner, prompt, params);
  ASSERT_TRUE(expected.ok()) << expected.status();
  v1::GenerateRequest request = TokenRequest(prompt, 12);
  auto* s = request.mutable_sampling();
  s->set_temperature(0.8f);
  s->set_top_k(40);
  s->set_top_p(0.9f);
  s->set_seed(5);
  s->set_repetition_penalty(1.3f);
  s->set_frequency_penalty(0.3f);
  s->set_min_tokens(4);
  s->set_logprobs(2);
  StreamResult got = RunGenerate(*stub, request);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const std::vector<int32_t>& tokens = got.tokens;
  const std::vector<v1::TokenLogprob>& logprobs = got.logprobs;
  EXPECT_EQ(tokens, expected->tokens);
  ASSERT_EQ(logprobs.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_FLOAT_EQ(logprobs[i].logprob(), expected->logprobs[i].logprob) << i;
    ASSERT_EQ(logprobs[i].top_size(), 2);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(logprobs[i].top(k).token_id(), expected->logprobs[i].top[k].token) << i;
    }
  }
}

// A JSON Schema request (structured output): the prefill worker's device
// sampler draws the first token under the mask, the decode worker's every
// later one; the reply equals the emulated CUDA backend's in one process
// and parses and validates, greedy and seeded.
TEST_F(CudaClusterTest, ConstrainedRequestsEqualTheBackendInOneProcessAndValidate) {
  std::unique_ptr<engine::ModelRunner> runner = LocalRunner();
  ASSERT_NE(runner, nullptr);
  auto config = engine::ModelConfig::FromModelDir(*model_dir_);
  ASSERT_TRUE(config.ok()) << config.status();
  auto grammars = engine::grammar::CreateGrammarCompiler(*model_dir_, *config);
  ASSERT_TRUE(grammars.ok()) << grammars.status();
  const nlohmann::ordered_json schema = LongSchema(/*min_tags=*/2);
  const std::string spec = SpecOf(schema);
  auto stub = cluster_->NewClient();
  const std::vector<int32_t> prompt = {256, 74, 83, 79, 78, 58, 32};
  for (float temperature : {0.0f, 0.8f}) {
    const engine::SamplingParams params{.temperature = temperature, .seed = 9, .max_tokens = 48};
    auto expected = engine::GenerateLocally(*runner, prompt, Constrained(params, **grammars, spec));
    ASSERT_TRUE(expected.ok()) << expected.status();
    v1::GenerateRequest request = TokenRequest(prompt, params.max_tokens);
    request.mutable_sampling()->set_temperature(temperature);
    request.mutable_sampling()->set_seed(params.seed);
    auto* format = request.mutable_sampling()->mutable_response_format()->mutable_json_schema();
    format->set_schema(schema.dump());
    format->set_strict(true);
    StreamResult got = RunGenerate(*stub, request);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, expected->tokens) << "temperature " << temperature;
    EXPECT_EQ(got.last.finish_reason(), v1::FINISH_REASON_STOP);
    EXPECT_EQ(ReplyViolation(schema, TextOf((*grammars)->vocab(), got.tokens)), "")
        << "temperature " << temperature;
  }
}

TEST_F(CudaClusterTest, NcclTransportGivesTheSameTokensAsTcp) {
  const std::vector<std::string> nccl_flags = {"--backend=cuda", "--num_kv_blocks=64",
                                               "--kv_transport=nccl"};
  std::filesystem::create_directories(*work_dir_ + "/nccl");
  LocalCluster nccl(ClusterOptions{.binaries = {.prefill = PDSERVE_PREFILL_EMULATED_CUDA_BIN,
                                                .decode = PDSERVE_DECODE_EMULATED_CUDA_BIN},
                                   .model_dir = *model_dir_,
                                   .work_dir = *work_dir_ + "/nccl",
                                   .num_prefill = 1,
                                   .num_decode = 1,
                                   .prefill_flags = nccl_flags,
                                   .decode_flags = nccl_flags});
  absl::Status started = nccl.Start();
  ASSERT_TRUE(started.ok()) << started;
  auto tcp_stub = cluster_->NewClient();
  auto nccl_stub = nccl.NewClient();
  std::vector<v1::GenerateRequest> requests;
  for (const auto& prompt : std::vector<std::vector<int32_t>>{
           {256, 72, 101, 108, 108, 111}, {1}, std::vector<int32_t>(33, 65)}) {
    requests.push_back(TokenRequest(prompt, 10));
  }
  v1::GenerateRequest seeded = TokenRequest({256, 80, 101, 110, 97, 108, 116, 121}, 10);
  seeded.mutable_sampling()->set_temperature(0.8f);
  seeded.mutable_sampling()->set_top_k(40);
  seeded.mutable_sampling()->set_seed(7);
  requests.push_back(seeded);
  for (const v1::GenerateRequest& request : requests) {
    StreamResult over_tcp = RunGenerate(*tcp_stub, request);
    StreamResult over_nccl = RunGenerate(*nccl_stub, request);
    ASSERT_TRUE(over_tcp.status.ok()) << over_tcp.status.error_message();
    ASSERT_TRUE(over_nccl.status.ok()) << over_nccl.status.error_message();
    EXPECT_FALSE(over_nccl.tokens.empty());
    EXPECT_EQ(over_nccl.tokens, over_tcp.tokens)
        << "prompt of " << request.token_ids().ids_size() << " tokens";
  }
  // The KV went over the nccl pair, and none of it failed.
  Process& prefill = *nccl.prefill()[0];
  EXPECT_GT(Metric(prefill, "pdserve_kv_transfer_bytes_total"), 0);
  EXPECT_EQ(Metric(prefill, "pdserve_kv_transfer_failures_total"), 0);
  EXPECT_EQ(Metric(*nccl.decode()[0], "pdserve_kv_transfer_receive_failures_total"), 0);
}

TEST_F(CudaClusterTest, WorkersReportTheDevicePeaks) {
  // 2 x memory clock x bus width of the emulated device (an H100 SXM's).
  EXPECT_NEAR(Metric(*cluster_->decode()[0], "pdserve_decode_peak_memory_bytes_per_second"),
              2 * 2619e6 * 5120 / 8, 1e6);
  EXPECT_GT(Metric(*cluster_->prefill()[0], "pdserve_prefill_peak_flops_per_second"), 0);
}

}  // namespace
}  // namespace pdserve::testing
