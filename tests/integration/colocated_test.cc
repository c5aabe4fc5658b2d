// The colocated baseline (colocated/colocated_*, pdserve_colocated; its
// step planning is the scheduler core's, tested in scheduler_test), as the
// real process on loopback:
// generations equal the in-process engine token for token, concurrent
// streams complete and free their KV, bad input is INVALID_ARGUMENT,
// cancellation frees KV, SIGTERM drains, and the OpenAI-compatible HTTP API
// and stop strings come from the same front end as the router's.
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "colocated/colocated_engine.h"
#include "common/grpc_util.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/generate_client.h"
#include "tests/integration/http_client.h"
#include "tests/integration/local_cluster.h"
#include "text/tokenizer.h"
#include "tools/model_writer.h"

namespace pdserve::testing {
namespace {

class ColocatedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::testing::TempDir() + "/pdserve_colocated_test";
    std::filesystem::remove_all(work_dir_);
    std::filesystem::create_directories(work_dir_);
    model_dir_ = work_dir_ + "/model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 512;
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/3, "f32", model_dir_).ok());
    const std::string ready = work_dir_ + "/colocated.ready";
    ASSERT_TRUE(server_
                    .Start({PDSERVE_COLOCATED_BIN, "--model_dir=" + model_dir_, "--threads=1",
                            "--num_kv_blocks=256", "--ready_file=" + ready},
                           work_dir_ + "/colocated.log")
                    .ok());
    auto fields = server_.WaitReady(ready, absl::Seconds(30));
    ASSERT_TRUE(fields.ok()) << fields.status();
    address_ = (*fields)["grpc_address"];
    ASSERT_TRUE(absl::SimpleAtoi((*fields)["metrics_port"], &metrics_port_));
    ASSERT_TRUE(absl::SimpleAtoi((*fields)["http_port"], &http_port_));
    stub_ = v1::Generation::NewStub(MakeChannel(address_));
  }

  double Metric(const std::string& name) {
    auto text = HttpGet(metrics_port_, "/metrics");
    return text.ok() ? MetricValue(*text, name) : -1;
  }
  bool WaitIdle(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (Metric("pdserve_kv_cache_usage_ratio") == 0 &&
          Metric("pdserve_colocated_running_sequences") == 0 &&
          Metric("pdserve_colocated_waiting_sequences") == 0) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::string work_dir_, model_dir_, address_;
  int metrics_port_ = 0;
  int http_port_ = 0;
  Subprocess server_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_F(ColocatedTest, GenerationsEqualTheInProcessEngine) {
  auto runner =
      engine::CreateModelRunner({.model_dir = model_dir_, .num_kv_blocks = 128, .num_threads = 1});
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::vector<std::vector<int32_t>> prompts = {{256, 72, 101, 108, 108, 111},
                                                     {1},
                                                     std::vector<int32_t>(40, 65),
                                                     {300, 12, 250, 3, 99, 42, 7, 8}};
  for (const auto& prompt : prompts) {
    for (uint64_t seed : {0u, 7u}) {
      engine::SamplingParams params;
      params.max_tokens = 20;
      if (seed != 0) {
        params.temperature = 0.8f;
        params.top_k = 40;
        params.top_p = 0.9f;
        params.seed = seed;
      }
      auto expected = engine::GenerateLocally(**runner, prompt, params);
      ASSERT_TRUE(expected.ok()) << expected.status();
      v1::GenerateRequest request = TokenRequest(prompt, 20);
      if (seed != 0) {
        request.mutable_sampling()->set_temperature(0.8f);
        request.mutable_sampling()->set_top_k(40);
        request.mutable_sampling()->set_top_p(0.9f);
        request.mutable_sampling()->set_seed(seed);
      }
      StreamResult got = RunGenerate(*stub_, request);
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      EXPECT_EQ(got.tokens, expected->tokens) << prompt.size() << " tokens, seed " << seed;
      EXPECT_EQ(static_cast<int>(got.last.finish_reason()),
                static_cast<int>(expected->finish_reason));
      EXPECT_EQ(got.last.usage().completion_tokens(), static_cast<int>(got.tokens.size()));
      EXPECT_EQ(got.last.timings().prefill_worker(), "colocated");
      EXPECT_GT(got.last.timings().time_to_first_token_seconds(), 0);
    }
  }
}

TEST_F(ColocatedTest, ConcurrentStreamsCompleteAndFreeTheirKv) {
  constexpr int kStreams = 12;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::Generation::NewStub(MakeChannel(address_));
      v1::GenerateRequest request = TokenRequest(std::vector<int32_t>(8 + 9 * i, 60 + i), 30 + i);
      request.mutable_sampling()->set_ignore_eos(true);
      results[i] = RunGenerate(*stub, request);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(30 + i));
    EXPECT_EQ(results[i].last.finish_reason(), v1::FINISH_REASON_LENGTH);
  }
  EXPECT_TRUE(WaitIdle(absl::Seconds(10)));
  EXPECT_GE(Metric("pdserve_colocated_prefill_steps_total"), 1);
  EXPECT_GE(Metric("pdserve_time_to_first_token_seconds_count"), kStreams);
}

TEST_F(ColocatedTest, BadInputIsInvalidArgument) {
  for (const auto& request :
       {TokenRequest({}, 4), TokenRequest({1, 2}, 0), TokenRequest({1, 100000}, 4),
        TokenRequest(std::vector<int32_t>(500, 5), 100)}) {
    StreamResult got = RunGenerate(*stub_, request);
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << got.status.error_message();
    EXPECT_TRUE(got.tokens.empty());
  }
}

TEST_F(ColocatedTest, CancelFreesKv) {
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    v1::GenerateRequest request = TokenRequest({256, 10, 20, 30, 40 + i}, 450);
    request.mutable_sampling()->set_ignore_eos(true);
    auto reader = stub_->Generate(&ctx, request);
    v1::GenerateResponse response;
    int received = 0;
    while (received < 3 && reader->Read(&response)) ++received;
    EXPECT_EQ(received, 3);
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(WaitIdle(absl::Seconds(10)));
}

TEST_F(ColocatedTest, ServesTheOpenAiApiAndStopStringsThroughTheFrontEnd) {
  using Json = nlohmann::json;
  auto runner =
      engine::CreateModelRunner({.model_dir = model_dir_, .num_kv_blocks = 128, .num_threads = 1});
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::vector<int32_t> prompt = {256, 72, 101, 108, 108, 111};
  engine::SamplingParams params;
  params.max_tokens = 24;
  params.ignore_eos = true;
  auto expected = engine::GenerateLocally(**runner, prompt, params);
  ASSERT_TRUE(expected.ok()) << expected.status();
  text::ByteTokenizer tokenizer((*runner)->config().vocab_size);
  const std::string text = tokenizer.Decode(expected->tokens);

  const Json request = {
      {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  HttpResult whole = Curl(http_port_, "/v1/completions", request.dump(), work_dir_ + "/body.json");
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(Json::parse(whole.body)["choices"][0]["text"], text);
  EXPECT_EQ(Json::parse(whole.body)["usage"]["completion_tokens"], 24);
  Json streamed = request;
  streamed["stream"] = true;
  HttpResult stream =
      Curl(http_port_, "/v1/completions", streamed.dump(), work_dir_ + "/body.json");
  ASSERT_EQ(stream.status, 200) << stream.body;
  const std::vector<std::string> events = SseData(stream.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string streamed_text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    streamed_text += Json::parse(events[i])["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed_text, text);
  // No chat template: refused naming the field.
  HttpResult chat =
      Curl(http_port_, "/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "hi"}]})", work_dir_ + "/body.json");
  EXPECT_EQ(chat.status, 400);
  EXPECT_EQ(Json::parse(chat.body)["error"]["param"], "messages");
  // Log-probabilities: one per generated token, each with its top alternative.
  HttpResult logprobs =
      Curl(http_port_, "/v1/completions",
           R"({"prompt": "hi", "max_tokens": 2, "logprobs": 1, "ignore_eos": true})",
           work_dir_ + "/body.json");
  ASSERT_EQ(logprobs.status, 200) << logprobs.body;
  const Json lp = Json::parse(logprobs.body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), 2u) << logprobs.body;
  ASSERT_EQ(lp["top_logprobs"].size(), 2u) << logprobs.body;
  for (const Json& value : lp["token_logprobs"]) EXPECT_LE(value.get<double>(), 0.0);
  for (const Json& top : lp["top_logprobs"]) EXPECT_EQ(top.size(), 1u) << logprobs.body;

  // Stop strings, matched by the front end: text before the stop, finish STOP.
  ASSERT_GE(text.size(), 12u);
  const std::string stop = CharacterAt(text, 8);
  v1::GenerateRequest with_stop = TokenRequest(prompt, 24);
  with_stop.mutable_sampling()->set_ignore_eos(true);
  with_stop.mutable_sampling()->add_stop(stop);
  StreamResult got = RunGenerate(*stub_, with_stop);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.last.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(got.last.matched_stop(), stop);
  EXPECT_EQ(got.text, text.substr(0, text.find(stop)));
  EXPECT_TRUE(WaitIdle(absl::Seconds(10)));
}

TEST_F(ColocatedTest, SigtermDrainsStreamsAndRefusesNewCalls) {
  constexpr int kStreams = 3;
  std::atomic<int> started{0};
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::Generation::NewStub(MakeChannel(address_));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      v1::GenerateRequest request = TokenRequest({256, 1, 2, 3, 4 + i}, 480);
      request.mutable_sampling()->set_ignore_eos(true);
      auto reader = stub->Generate(&ctx, request);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
        if (results[i].tokens.empty()) started.fetch_add(1);
        results[i].tokens.insert(results[i].tokens.end(), response.token_ids().begin(),
                                 response.token_ids().end());
      }
      results[i].status = reader->Finish();
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (started.load() < kStreams && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  ASSERT_EQ(started.load(), kStreams);
  ASSERT_EQ(kill(server_.pid(), SIGTERM), 0);
  grpc::Status refused;
  for (int i = 0; i < 200; ++i) {
    refused = RunGenerate(*stub_, TokenRequest({1, 2, 3}, 2)).status;
    if (refused.error_code() == grpc::StatusCode::UNAVAILABLE) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), 480u);
  }
  EXPECT_TRUE(WaitUntilExited(server_.pid(), absl::Seconds(15)));
  EXPECT_EQ(server_.Stop(absl::Seconds(1)), 0) << server_.ReadLog();
}

}  // namespace
}  // namespace pdserve::testing
