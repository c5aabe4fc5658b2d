// End to end on loopback: a real router, prefill worker and decode worker
// (separate processes, KV over TCP) serve streamed generations that must
// equal the same engine run in one process, token for token.
#include <atomic>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/runtime/generator.h"
#include "tools/model_writer.h"
#include "engine/runner_factory.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/tokenizer_loader.h"
#include "tools/tokenizer_writer.h"
#include "gtest/gtest.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/local_cluster.h"
#include "tests/util/poll.h"

namespace pdserve::testing {
namespace {

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_dir_ = new std::string(::testing::TempDir() + "/pdserve_cluster_test");
    std::filesystem::remove_all(*work_dir_);
    std::filesystem::create_directories(*work_dir_);
    model_dir_ = new std::string(*work_dir_ + "/model");
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 512;
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/7, "f32", *model_dir_).ok());
    cluster_ = new LocalCluster(ClusterOptions{.model_dir = *model_dir_, .work_dir = *work_dir_});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  static std::unique_ptr<engine::ModelRunner> LocalRunner() {
    auto runner = engine::CreateModelRunner({.model_dir = *model_dir_, .num_kv_blocks = 128, .num_threads = 1});
    EXPECT_TRUE(runner.ok()) << runner.status();
    return std::move(*runner);
  }

  double WorkerMetric(Process& p, const std::string& name) {
    auto text = HttpGet(p.metrics_port, "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? MetricValue(*text, name) : -1;
  }

  // Waits until both workers hold no KV; false if they still do after a
  // generous deadline.
  bool WaitKvFreed() {
    return PollUntil(
        [&] {
          return WorkerMetric(*cluster_->decode()[0], "pdserve_kv_cache_usage_ratio") == 0 &&
                 WorkerMetric(*cluster_->prefill()[0], "pdserve_kv_cache_usage_ratio") == 0 &&
                 WorkerMetric(*cluster_->decode()[0], "pdserve_decode_running_sequences") == 0 &&
                 WorkerMetric(*cluster_->decode()[0], "pdserve_decode_waiting_kv_sequences") == 0;
        },
        kGenerousDeadline, absl::Milliseconds(50));
  }

  static std::string* work_dir_;
  static std::string* model_dir_;
  static LocalCluster* cluster_;
};
std::string* ClusterTest::work_dir_ = nullptr;
std::string* ClusterTest::model_dir_ = nullptr;
LocalCluster* ClusterTest::cluster_ = nullptr;

TEST_F(ClusterTest, GreedyEqualsInProcessEngine) {
  auto runner = LocalRunner();
  auto stub = cluster_->NewClient();
  const std::vector<std::vector<int32_t>> prompts = {
      {256, 72, 101, 108, 108, 111},
      {1},
      {256, 84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114, 111, 119, 110, 32, 102, 111, 120},
      std::vector<int32_t>(40, 65),
      {300, 12, 250, 3, 99, 42, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}};
  for (const auto& prompt : prompts) {
    engine::SamplingParams params;
    params.max_tokens = 24;
    auto expected = engine::GenerateLocally(*runner, prompt, params);
    ASSERT_TRUE(expected.ok()) << expected.status();
    StreamResult got = RunGenerate(*stub, TokenRequest(prompt, 24));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, expected->tokens) << "prompt of " << prompt.size() << " tokens";
    EXPECT_EQ(static_cast<int>(got.last.finish_reason()), static_cast<int>(expected->finish_reason));
    EXPECT_EQ(got.last.usage().prompt_tokens(), static_cast<int>(prompt.size()));
    EXPECT_EQ(got.last.usage().completion_tokens(), static_cast<int>(got.tokens.size()));
    EXPECT_GT(got.last.timings().time_to_first_token_seconds(), 0);
  }
}

TEST_F(ClusterTest, SeededSamplingEqualsInProcessEngine) {
  auto runner = LocalRunner();
  auto stub = cluster_->NewClient();
  const std::vector<int32_t> prompt = {256, 83, 97, 109, 112, 108, 101};
  for (uint64_t seed : {1u, 2u, 99u}) {
    engine::SamplingParams params{.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .seed = seed,
                                  .max_tokens = 20};
    auto expected = engine::GenerateLocally(*runner, prompt, params);
    ASSERT_TRUE(expected.ok());
    v1::GenerateRequest request = TokenRequest(prompt, 20);
    request.mutable_sampling()->set_temperature(0.9f);
    request.mutable_sampling()->set_top_k(50);
    request.mutable_sampling()->set_top_p(0.95f);
    request.mutable_sampling()->set_seed(seed);
    StreamResult got = RunGenerate(*stub, request);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, expected->tokens) << "seed " << seed;
  }
}

TEST_F(ClusterTest, PenaltiesMinPAndLogprobsEqualInProcessEngine) {
  auto runner = LocalRunner();
  auto stub = cluster_->NewClient();
  const std::vector<int32_t> prompt = {256, 80, 101, 110, 97, 108, 116, 121};
  engine::SamplingParams params{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f,
                                .seed = 5, .max_tokens = 24, .repetition_penalty = 1.3f,
                                .presence_penalty = 0.5f, .frequency_penalty = 0.3f,
                                .min_tokens = 10, .logprobs = 3};
  auto expected = engine::GenerateLocally(*runner, prompt, params);
  ASSERT_TRUE(expected.ok()) << expected.status();
  v1::GenerateRequest request = TokenRequest(prompt, 24);
  auto* s = request.mutable_sampling();
  s->set_temperature(0.8f);
  s->set_top_k(40);
  s->set_top_p(0.9f);
  s->set_min_p(0.05f);
  s->set_seed(5);
  s->set_repetition_penalty(1.3f);
  s->set_presence_penalty(0.5f);
  s->set_frequency_penalty(0.3f);
  s->set_min_tokens(10);
  s->set_logprobs(3);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, request);
  v1::GenerateResponse response;
  std::vector<int32_t> tokens;
  std::vector<v1::TokenLogprob> logprobs;
  while (reader->Read(&response)) {
    tokens.insert(tokens.end(), response.token_ids().begin(), response.token_ids().end());
    logprobs.insert(logprobs.end(), response.logprobs().begin(), response.logprobs().end());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, expected->tokens);
  ASSERT_EQ(logprobs.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(logprobs[i].token_id(), tokens[i]);
    EXPECT_FLOAT_EQ(logprobs[i].logprob(), expected->logprobs[i].logprob) << i;
    ASSERT_EQ(logprobs[i].top_size(), 3);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(logprobs[i].top(k).token_id(), expected->logprobs[i].top[k].token);
    }
    EXPECT_GE(logprobs[i].top(0).logprob(), logprobs[i].top(2).logprob());
  }
}

TEST_F(ClusterTest, StopStringIsMatchedAcrossTokensAndNotLeaked) {
  auto runner = LocalRunner();
  auto stub = cluster_->NewClient();
  const std::vector<int32_t> prompt = {256, 83, 116, 111, 112};
  engine::SamplingParams params;
  params.max_tokens = 40;
  params.ignore_eos = true;
  auto expected = engine::GenerateLocally(*runner, prompt, params);
  ASSERT_TRUE(expected.ok());
  // The text the router will produce, and how much of it each token completes.
  text::ByteTokenizer tokenizer(runner->config().vocab_size);
  text::IncrementalDetokenizer detok(tokenizer);
  std::string full;
  std::vector<size_t> text_after;  // text length after each token
  for (int32_t t : expected->tokens) {
    full += detok.Push(t);
    text_after.push_back(full.size());
  }
  ASSERT_GE(full.size(), 20u);
  // A whole-character stop string from the middle of the continuation.
  const std::string stop = CharacterAt(full, 10);
  const size_t at = full.find(stop);
  size_t expected_tokens = 0;
  while (text_after[expected_tokens] < at + stop.size()) ++expected_tokens;
  ++expected_tokens;
  v1::GenerateRequest request = TokenRequest(prompt, 40);
  request.mutable_sampling()->set_ignore_eos(true);
  request.mutable_sampling()->add_stop(stop);
  StreamResult got = RunGenerate(*stub, request);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.last.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(got.last.matched_stop(), stop);
  // Tokens up to the one completing the stop string; text strictly before it.
  EXPECT_EQ(got.tokens.size(), expected_tokens);
  EXPECT_EQ(got.text, full.substr(0, at));
  EXPECT_TRUE(WaitKvFreed());
}

TEST_F(ClusterTest, TextPromptStreamsValidUtf8) {
  auto stub = cluster_->NewClient();
  v1::GenerateRequest request;
  request.set_text("Héllo, wörld — ☃ 你好");
  request.set_add_bos(true);
  request.mutable_sampling()->set_max_tokens(32);
  request.mutable_sampling()->set_ignore_eos(true);
  StreamResult got = RunGenerate(*stub, request);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens.size(), 32u);
  EXPECT_EQ(got.last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(got.last.usage().prompt_tokens(), 1 + static_cast<int>(std::string("Héllo, wörld — ☃ 你好").size()));
  EXPECT_GE(got.messages, 2);
}

TEST_F(ClusterTest, EightConcurrentStreamsComplete) {
  constexpr int kStreams = 8;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto stub = cluster_->NewClient();
      v1::GenerateRequest request = TokenRequest({256, 65 + i, 66, 67, 68 + i}, 40 + i);
      request.mutable_sampling()->set_ignore_eos(true);
      request.mutable_sampling()->set_temperature(0.7f);
      request.mutable_sampling()->set_seed(1000 + i);
      results[i] = RunGenerate(*stub, request);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(40 + i));
    EXPECT_EQ(results[i].last.finish_reason(), v1::FINISH_REASON_LENGTH);
  }
  EXPECT_TRUE(WaitKvFreed());
}

TEST_F(ClusterTest, BadInputIsInvalidArgumentNamingTheField) {
  auto stub = cluster_->NewClient();
  struct Case {
    std::string name;
    v1::GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  {
    v1::GenerateRequest r;
    r.mutable_sampling()->set_max_tokens(4);
    cases.push_back({"no input", r, "input"});
    r.set_text("");
    cases.push_back({"empty text", r, "text"});
  }
  {
    v1::GenerateRequest r = TokenRequest({}, 4);
    r.mutable_token_ids();
    cases.push_back({"empty token ids", r, "token_ids"});
  }
  cases.push_back({"too long", TokenRequest(std::vector<int32_t>(600, 5), 4), "input"});
  cases.push_back({"max_tokens 0", TokenRequest({1, 2}, 0), "max_tokens"});
  cases.push_back({"max_tokens negative", TokenRequest({1, 2}, -3), "max_tokens"});
  cases.push_back({"past context", TokenRequest(std::vector<int32_t>(500, 5), 100), "max_tokens"});
  cases.push_back({"token out of range", TokenRequest({1, 100000}, 4), "token_ids"});
  {
    v1::GenerateRequest r = TokenRequest({1, 2}, 4);
    r.mutable_sampling()->set_temperature(-1);
    cases.push_back({"negative temperature", r, "temperature"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 2}, 4);
    r.mutable_sampling()->set_top_p(1.5f);
    cases.push_back({"top_p above 1", r, "top_p"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 2}, 4);
    r.mutable_sampling()->set_top_k(-2);
    cases.push_back({"negative top_k", r, "top_k"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 2}, 4);
    r.mutable_sampling()->add_stop_token_ids(-1);
    cases.push_back({"bad stop token", r, "stop_token_ids"});
  }
  for (const Case& c : cases) {
    StreamResult got = RunGenerate(*stub, c.request);
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_NE(got.status.error_message().find(c.field), std::string::npos)
        << c.name << ": \"" << got.status.error_message() << "\" does not name " << c.field;
    EXPECT_EQ(got.messages, 0) << c.name;
  }
}

TEST_F(ClusterTest, CancelAndDeadlineFreeKvOnBothWorkers) {
  auto stub = cluster_->NewClient();
  // Cancel after the first tokens arrived.
  for (int i = 0; i < 4; ++i) {
    grpc::ClientContext ctx;
    v1::GenerateRequest request = TokenRequest({256, 10, 20, 30, static_cast<int32_t>(40 + i)}, 400);
    request.mutable_sampling()->set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, request);
    v1::GenerateResponse response;
    int received = 0;
    while (received < 3 && reader->Read(&response)) ++received;
    EXPECT_EQ(received, 3);
    ctx.TryCancel();
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Cancel before anything arrived, and a deadline that expires mid-stream.
  for (int i = 0; i < 4; ++i) {
    grpc::ClientContext ctx;
    if (i % 2 == 0) ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(30)));
    v1::GenerateRequest request = TokenRequest(std::vector<int32_t>(64, 7 + i), 440);
    request.mutable_sampling()->set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, request);
    if (i % 2 == 1) ctx.TryCancel();
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::CANCELLED ||
                s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        << s.error_message();
  }
  EXPECT_TRUE(WaitKvFreed()) << "KV not freed after cancellations";
}

TEST_F(ClusterTest, InvalidUtf8IsInvalidArgumentNamingTheField) {
  auto stub = cluster_->NewClient();
  // protobuf's C++ serializer logs such strings but sends them, as other
  // clients may.
  v1::GenerateRequest text = TokenRequest({}, 4);
  text.set_text("caf\xC3");
  StreamResult got = RunGenerate(*stub, text);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(got.status.error_message(), "text is not valid UTF-8");
  v1::GenerateRequest chat = TokenRequest({}, 4);
  chat.mutable_chat()->add_messages()->set_content("fine");
  chat.mutable_chat()->add_messages()->set_content("\xFF");
  got = RunGenerate(*stub, chat);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(got.status.error_message(), "chat.messages[1].content is not valid UTF-8");
  v1::GenerateRequest stop = TokenRequest({1, 2}, 4);
  stop.mutable_sampling()->add_stop("\xE2\x82");
  got = RunGenerate(*stub, stop);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(got.status.error_message(), "sampling.stop[0] is not valid UTF-8");
}

// pdserve_requests_total counts every call once, by how it ended.
TEST_F(ClusterTest, EveryCallIsCountedOnceByHowItEnded) {
  auto stub = cluster_->NewClient();
  auto counts = [&] {
    auto text = HttpGet(cluster_->router_metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok());
    std::map<std::string, double> out;
    for (const char* label : {"length", "stop", "context", "cancelled", "deadline", "error",
                              "rejected"}) {
      out[label] = MetricValue(*text, absl::StrCat("pdserve_requests_total{finish_reason=\"",
                                                   label, "\"}"));
    }
    return out;
  };
  const auto before = counts();
  // Deadlines that expire mid-stream.
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(30)));
    v1::GenerateRequest request = TokenRequest(std::vector<int32_t>(64, 9 + i), 440);
    request.mutable_sampling()->set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // Cancelled after the first message, and while the client read nothing.
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    v1::GenerateRequest request = TokenRequest({256, 10, 20, static_cast<int32_t>(30 + i)}, 400);
    request.mutable_sampling()->set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, request);
    v1::GenerateResponse response;
    if (i == 0) {
      EXPECT_TRUE(reader->Read(&response));
    } else {
      absl::SleepFor(absl::Milliseconds(50));
    }
    ctx.TryCancel();
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Refused, and served to the end.
  EXPECT_EQ(RunGenerate(*stub, TokenRequest({1, 100000}, 4)).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest ok = TokenRequest({256, 1, 2}, 3);
  ok.mutable_sampling()->set_ignore_eos(true);
  EXPECT_TRUE(RunGenerate(*stub, ok).status.ok());
  EXPECT_TRUE(WaitKvFreed());

  const auto after = counts();
  EXPECT_EQ(after.at("deadline") - before.at("deadline"), 2);
  EXPECT_EQ(after.at("cancelled") - before.at("cancelled"), 2);
  EXPECT_EQ(after.at("rejected") - before.at("rejected"), 1);
  EXPECT_EQ(after.at("length") - before.at("length"), 1);
  double total = 0;
  for (const auto& [label, value] : after) total += value - before.at(label);
  EXPECT_EQ(total, 6);
}

TEST_F(ClusterTest, MetricsCountTtftAndItl) {
  auto stub = cluster_->NewClient();
  auto before = HttpGet(cluster_->router_metrics_port(), "/metrics");
  ASSERT_TRUE(before.ok()) << before.status();
  v1::GenerateRequest request = TokenRequest({256, 1, 2, 3}, 8);
  request.mutable_sampling()->set_ignore_eos(true);
  ASSERT_TRUE(RunGenerate(*stub, request).status.ok());
  auto text = HttpGet(cluster_->router_metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_GT(MetricValue(*text, "pdserve_time_to_first_token_seconds_count"), 0);
  EXPECT_GT(MetricValue(*text, "pdserve_inter_token_latency_seconds_count"), 0);
  EXPECT_GT(MetricValue(*text, "pdserve_e2e_request_latency_seconds_count"), 0);
  EXPECT_GT(MetricValue(*text, "pdserve_request_queue_time_seconds_count"), 0);
  EXPECT_GT(MetricValue(*text, "pdserve_requests_total"), 0);
  EXPECT_GT(MetricValue(*text, "pdserve_generation_tokens_total"), 0);
  EXPECT_GT(MetricValue(*text, "pdserve_prompt_tokens_total"), 0);
  // Its max_tokens, counted once at admission.
  EXPECT_EQ(MetricValue(*text, "pdserve_requested_max_tokens_total") -
                MetricValue(*before, "pdserve_requested_max_tokens_total"),
            8);
  EXPECT_NE(text->find("pdserve_requests_in_flight"), std::string::npos);
  EXPECT_GT(WorkerMetric(*cluster_->prefill()[0], "pdserve_kv_transfer_bytes_total"), 0);
  EXPECT_GT(WorkerMetric(*cluster_->prefill()[0], "pdserve_kv_transfer_seconds_count"), 0);
  auto prefill_text = HttpGet(cluster_->prefill()[0]->metrics_port, "/metrics");
  ASSERT_TRUE(prefill_text.ok());
  EXPECT_NE(prefill_text->find("pdserve_prefill_queue_depth"), std::string::npos);
  EXPECT_GT(WorkerMetric(*cluster_->decode()[0], "pdserve_decode_step_seconds_count"), 0);
}

// A decode worker with --stream_interval=4 sends a stream's tokens four
// steps at a time: the client gets the same tokens, greedy and seeded, in
// about a quarter of the messages, and a stream that ends between two
// bursts still gets its last tokens with its end.
TEST(StreamIntervalClusterTest, TokensComeInBurstsAndEqualTheInProcessEngine) {
  const std::string work_dir = ::testing::TempDir() + "/pdserve_stream_interval_test";
  std::filesystem::remove_all(work_dir);
  const std::string model_dir = work_dir + "/model";
  engine::ModelConfig config = engine::DefaultDemoConfig();
  config.max_position_embeddings = 512;
  ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/7, "f32", model_dir).ok());
  LocalCluster cluster(ClusterOptions{
      .model_dir = model_dir, .work_dir = work_dir, .decode_flags = {"--stream_interval=4"}});
  ASSERT_TRUE(cluster.Start().ok());
  auto runner =
      engine::CreateModelRunner({.model_dir = model_dir, .num_kv_blocks = 128, .num_threads = 1});
  ASSERT_TRUE(runner.ok()) << runner.status();
  auto stub = cluster.NewClient();
  const std::vector<int32_t> prompt = {256, 72, 101, 108, 108, 111};
  // 25 tokens: the first from the prefill worker, then 24 = six bursts of
  // four; 23: five bursts and the last three with the end.
  for (int max_tokens : {25, 23}) {
    for (std::optional<uint64_t> seed : {std::optional<uint64_t>(), std::optional<uint64_t>(5)}) {
      engine::SamplingParams params{.max_tokens = max_tokens, .ignore_eos = true};
      v1::GenerateRequest request = TokenRequest(prompt, max_tokens);
      request.mutable_sampling()->set_ignore_eos(true);
      if (seed.has_value()) {
        params.temperature = 0.9f;
        params.seed = *seed;
        request.mutable_sampling()->set_temperature(0.9f);
        request.mutable_sampling()->set_seed(*seed);
      }
      auto expected = engine::GenerateLocally(**runner, prompt, params);
      ASSERT_TRUE(expected.ok()) << expected.status();
      StreamResult got = RunGenerate(*stub, request);
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      EXPECT_EQ(got.tokens, expected->tokens) << max_tokens;
      EXPECT_EQ(got.last.usage().completion_tokens(), max_tokens);
      // One message for the first token, one per burst, perhaps one for the
      // end: at most 9, where one token per message would be 25 or 23.
      EXPECT_LE(got.messages, 1 + (max_tokens - 1 + 3) / 4 + 1) << max_tokens;
    }
  }
}

// A model that ships tokenizer files, a chat template and
// generation_config.json, as a real Llama 3 Instruct checkpoint does.
TEST(ChatClusterTest, ChatIsRenderedTokenizedAndEqualsInProcessEngine) {
  const std::string work_dir = ::testing::TempDir() + "/pdserve_chat_cluster_test";
  std::filesystem::remove_all(work_dir);
  const std::string model_dir = work_dir + "/model";
  engine::ModelConfig config = engine::DefaultDemoConfig();
  config.max_position_embeddings = 512;
  engine::RandomModelOptions options{.seed = 5,
                                     .write_generation_config = true,
                                     .generation_eos_token_ids = {engine::kDemoEndOfTextId,
                                                                  engine::kDemoEotId}};
  ASSERT_TRUE(engine::WriteRandomModel(config, options, model_dir).ok());
  ASSERT_TRUE(engine::WriteDemoTokenizer(config.vocab_size, model_dir).ok());
  LocalCluster cluster(ClusterOptions{.model_dir = model_dir, .work_dir = work_dir});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();

  auto tokenizer = text::LoadTokenizer(model_dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto chat_template = text::LoadChatTemplate(model_dir);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  auto runner = engine::CreateModelRunner({.model_dir = model_dir, .num_kv_blocks = 128, .num_threads = 1});
  ASSERT_TRUE(runner.ok()) << runner.status();
  // generation_config.json's EOS reached the engine.
  EXPECT_TRUE((*runner)->config().IsEos(engine::kDemoEotId));

  const std::vector<text::ChatMessage> conversation = {
      {"system", "You answer in one line."}, {"user", "What does the decode pool do?"}};
  v1::GenerateRequest request;
  for (const auto& m : conversation) {
    v1::ChatMessage* message = request.mutable_chat()->add_messages();
    message->set_role(m.role);
    message->set_content(m.content);
  }
  request.mutable_sampling()->set_max_tokens(40);
  auto rendered = text::RenderChat(*chat_template, conversation, /*add_generation_prompt=*/true);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  const std::vector<int32_t> prompt = (*tokenizer)->Encode(*rendered);
  ASSERT_EQ(prompt[0], engine::kDemoBosId);

  for (const float temperature : {0.0f, 0.9f}) {
    request.mutable_sampling()->set_temperature(temperature);
    request.mutable_sampling()->set_seed(3);
    engine::SamplingParams params;
    params.max_tokens = 40;
    params.temperature = temperature;
    params.seed = 3;
    auto expected = engine::GenerateLocally(**runner, prompt, params);
    ASSERT_TRUE(expected.ok()) << expected.status();
    StreamResult got = RunGenerate(*stub, request);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.last.usage().prompt_tokens(), static_cast<int>(prompt.size()));
    EXPECT_EQ(got.tokens, expected->tokens) << "temperature " << temperature;
    EXPECT_EQ(static_cast<int>(got.last.finish_reason()), static_cast<int>(expected->finish_reason));
    // The router detokenized with the model's tokenizer, specials skipped.
    EXPECT_EQ(got.text, (*tokenizer)->Decode(got.tokens));
  }

  // Text prompts take BOS from the tokenizer and go through its merges.
  v1::GenerateRequest text_request;
  text_request.set_text("the cache of the answer");
  text_request.set_add_bos(true);
  text_request.mutable_sampling()->set_max_tokens(4);
  StreamResult text_got = RunGenerate(*stub, text_request);
  ASSERT_TRUE(text_got.status.ok()) << text_got.status.error_message();
  std::vector<int32_t> text_prompt = {engine::kDemoBosId};
  for (int32_t t : (*tokenizer)->Encode("the cache of the answer")) text_prompt.push_back(t);
  EXPECT_EQ(text_got.last.usage().prompt_tokens(), static_cast<int>(text_prompt.size()));
  EXPECT_LT(text_prompt.size(), std::string("the cache of the answer").size());

  // A conversation the router cannot render is INVALID_ARGUMENT naming the field.
  v1::GenerateRequest bad;
  bad.mutable_chat()->add_messages()->set_role("narrator");
  bad.mutable_sampling()->set_max_tokens(4);
  StreamResult bad_got = RunGenerate(*stub, bad);
  EXPECT_EQ(bad_got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad_got.status.error_message().find("chat.messages[0].role"), std::string::npos)
      << bad_got.status.error_message();
}

// A second cluster shape: capacity and empty pools.
class ClusterLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::testing::TempDir() + "/pdserve_limits_test";
    std::filesystem::remove_all(work_dir_);
    std::filesystem::create_directories(work_dir_);
    model_dir_ = work_dir_ + "/model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 512;
    ASSERT_TRUE(engine::WriteRandomModel(config, 11, "f32", model_dir_).ok());
  }
  std::string work_dir_;
  std::string model_dir_;
};

TEST_F(ClusterLimitsTest, EmptyPoolsAreUnavailableAndFullCacheIsResourceExhausted) {
  // Router with a decode worker whose cache holds 4 blocks of 16 tokens, and
  // no prefill worker at first.
  LocalCluster cluster(ClusterOptions{.model_dir = model_dir_, .work_dir = work_dir_, .num_prefill = 0,
                                      .num_decode = 0,
                                      .decode_flags = {"--kv_cache_bytes=0", "--num_kv_blocks=4"}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  StreamResult got = RunGenerate(*stub, TokenRequest({1, 2, 3}, 4));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE) << got.status.error_message();
  EXPECT_NE(got.status.error_message().find("decode"), std::string::npos);

  ASSERT_TRUE(cluster.AddDecode().ok());
  ASSERT_TRUE(cluster.WaitForPools(0, 1, absl::Seconds(20)).ok());
  got = RunGenerate(*stub, TokenRequest({1, 2, 3}, 4));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE) << got.status.error_message();
  EXPECT_NE(got.status.error_message().find("prefill"), std::string::npos);

  ASSERT_TRUE(cluster.AddPrefill().ok());
  ASSERT_TRUE(cluster.WaitForPools(1, 1, absl::Seconds(20)).ok());
  got = RunGenerate(*stub, TokenRequest({1, 2, 3}, 4));
  EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  // 60 + 40 tokens need more than 64 slots.
  got = RunGenerate(*stub, TokenRequest(std::vector<int32_t>(60, 3), 40));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << got.status.error_message();

  // A killed worker drops out of the pool.
  cluster.decode()[0]->proc.Kill();
  ASSERT_TRUE(cluster.WaitForPools(1, 0, absl::Seconds(20)).ok());
  got = RunGenerate(*stub, TokenRequest({1, 2, 3}, 4));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE);

  auto text = HttpGet(cluster.router_metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok());
  EXPECT_GE(MetricValue(*text, "pdserve_requests_rejected_total"), 4);
}

TEST_F(ClusterLimitsTest, RouterAdmissionLimitIsResourceExhausted) {
  LocalCluster cluster(ClusterOptions{.model_dir = model_dir_, .work_dir = work_dir_, .num_prefill = 0,
                                      .num_decode = 0, .router_flags = {"--max_in_flight=0"}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  StreamResult got = RunGenerate(*stub, TokenRequest({1, 2, 3}, 4));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << got.status.error_message();
}

}  // namespace
}  // namespace pdserve::testing
