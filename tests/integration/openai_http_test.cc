// The router's OpenAI-compatible HTTP API on a real local cluster (router,
// prefill and decode workers on loopback): through curl, through a raw
// socket that hangs up, and through the official `openai` npm client
// (tests/openai_client). Generations must equal the in-process engine's.
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/demo_chat_model.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/http_client.h"
#include "tests/integration/local_cluster.h"
#include "tests/util/poll.h"
#include "text/chat_template.h"
#include "text/tokenizer_loader.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::testing {
namespace {

using Json = nlohmann::json;

class OpenAiHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_dir_ = new std::string(::testing::TempDir() + "/pdserve_openai_http_test");
    std::filesystem::remove_all(*work_dir_);
    std::filesystem::create_directories(*work_dir_);
    model_dir_ = new std::string(*work_dir_ + "/model");
    ASSERT_TRUE(WriteDemoChatModel(*model_dir_, 512, /*seed=*/5).ok());
    cluster_ = new LocalCluster(ClusterOptions{.model_dir = *model_dir_, .work_dir = *work_dir_});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_GT(cluster_->router_http_port(), 0);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  HttpResult Post(const std::string& path, const std::string& body) {
    return Curl(cluster_->router_http_port(), path, body, *work_dir_ + "/body.json");
  }
  HttpResult Get(const std::string& path) {
    return Curl(cluster_->router_http_port(), path, "", "");
  }

  double RouterMetric(const std::string& name) {
    auto text = HttpGet(cluster_->router_metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? MetricValue(*text, name) : -1;
  }
  double WorkerMetric(Process& p, const std::string& name) {
    auto text = HttpGet(p.metrics_port, "/metrics");
    return text.ok() ? MetricValue(*text, name) : -1;
  }
  // Waits until both workers hold no KV and the router has nothing in flight.
  bool WaitIdle() {
    return PollUntil(
        [&] {
          return WorkerMetric(*cluster_->decode()[0], "pdserve_kv_cache_usage_ratio") == 0 &&
                 WorkerMetric(*cluster_->prefill()[0], "pdserve_kv_cache_usage_ratio") == 0 &&
                 WorkerMetric(*cluster_->decode()[0], "pdserve_decode_running_sequences") == 0 &&
                 RouterMetric("pdserve_requests_in_flight") == 0;
        },
        kGenerousDeadline, absl::Milliseconds(50));
  }

  // What the in-process engine generates greedily for `prompt`, as text.
  struct Expected {
    std::vector<int32_t> tokens;
    std::string text;
    std::string finish_reason;
  };
  static Expected Generate(const std::vector<int32_t>& prompt, int max_tokens) {
    auto runner = engine::CreateModelRunner(
        {.model_dir = *model_dir_, .num_kv_blocks = 128, .num_threads = 1});
    EXPECT_TRUE(runner.ok()) << runner.status();
    engine::SamplingParams params;
    params.max_tokens = max_tokens;
    auto result = engine::GenerateLocally(**runner, prompt, params);
    EXPECT_TRUE(result.ok()) << result.status();
    auto tokenizer = text::LoadTokenizer(*model_dir_);
    EXPECT_TRUE(tokenizer.ok());
    return {result->tokens, (*tokenizer)->Decode(result->tokens),
            result->finish_reason == engine::FinishReason::kStop ? "stop" : "length"};
  }
  // The prompt tokens of a chat, rendered as the router renders it.
  static std::vector<int32_t> ChatPrompt(const std::vector<text::ChatMessage>& messages) {
    auto tokenizer = text::LoadTokenizer(*model_dir_);
    auto chat_template = text::LoadChatTemplate(*model_dir_);
    EXPECT_TRUE(tokenizer.ok() && chat_template.ok());
    auto rendered = text::RenderChat(*chat_template, messages, /*add_generation_prompt=*/true);
    EXPECT_TRUE(rendered.ok()) << rendered.status();
    return (*tokenizer)->Encode(*rendered);
  }

  static std::string* work_dir_;
  static std::string* model_dir_;
  static LocalCluster* cluster_;
};
std::string* OpenAiHttpTest::work_dir_ = nullptr;
std::string* OpenAiHttpTest::model_dir_ = nullptr;
LocalCluster* OpenAiHttpTest::cluster_ = nullptr;

const std::vector<int32_t> kPrompt = {256, 84, 104, 101, 32, 99, 97, 99, 104, 101};

TEST_F(OpenAiHttpTest, CurlHealthModelsAndCompletions) {
  HttpResult health = Get("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(Json::parse(health.body)["status"], "ok");
  HttpResult models = Get("/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(Json::parse(models.body)["data"][0]["id"], "model");
  EXPECT_EQ(Json::parse(models.body)["data"][0]["max_model_len"], 512);

  const Expected expected = Generate(kPrompt, 16);
  const Json request = {
      {"model", "model"}, {"prompt", kPrompt}, {"max_tokens", 16}, {"temperature", 0}};
  HttpResult whole = Post("/v1/completions", request.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json body = Json::parse(whole.body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "model");
  EXPECT_EQ(body["choices"][0]["text"], expected.text);
  EXPECT_EQ(body["choices"][0]["finish_reason"], expected.finish_reason);
  EXPECT_EQ(body["usage"]["prompt_tokens"], kPrompt.size());
  EXPECT_EQ(body["usage"]["completion_tokens"], expected.tokens.size());

  Json stream_request = request;
  stream_request["stream"] = true;
  stream_request["stream_options"] = {{"include_usage", true}};
  HttpResult stream = Post("/v1/completions", stream_request.dump());
  ASSERT_EQ(stream.status, 200) << stream.body;
  const std::vector<std::string> events = SseData(stream.body);
  ASSERT_GE(events.size(), 3u) << stream.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  Json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json chunk = Json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    if (!chunk["usage"].is_null()) usage = chunk["usage"];
    if (chunk["choices"].empty()) continue;
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null())
      finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, expected.text);
  EXPECT_EQ(finish, expected.finish_reason);
  EXPECT_EQ(usage["completion_tokens"], expected.tokens.size());
  EXPECT_EQ(usage["total_tokens"], kPrompt.size() + expected.tokens.size());
}

// A text prompt is tokenized alike over gRPC (add_bos unset) and HTTP: the
// tokenizer's own add_bos_token decides the BOS, so both generate the same.
TEST_F(OpenAiHttpTest, GrpcAndHttpTokenizeTextAlike) {
  auto tokenizer = text::LoadTokenizer(*model_dir_);
  ASSERT_TRUE(tokenizer.ok());
  ASSERT_TRUE((*tokenizer)->add_bos_token());
  const std::string prompt = "Hello there";
  const size_t expected_tokens = (*tokenizer)->Encode(prompt).size() + 1;  // BOS first

  v1::GenerateRequest request;
  request.set_text(prompt);
  request.mutable_sampling()->set_max_tokens(12);
  auto stub = cluster_->NewClient();
  const StreamResult grpc_reply = RunGenerate(*stub, request);
  ASSERT_TRUE(grpc_reply.status.ok()) << grpc_reply.status.error_message();
  EXPECT_EQ(grpc_reply.last.usage().prompt_tokens(), static_cast<int>(expected_tokens));

  const Json body = {
      {"model", "model"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}};
  HttpResult http = Post("/v1/completions", body.dump());
  ASSERT_EQ(http.status, 200) << http.body;
  const Json reply = Json::parse(http.body);
  EXPECT_EQ(reply["usage"]["prompt_tokens"], expected_tokens);
  EXPECT_EQ(reply["choices"][0]["text"], grpc_reply.text);

  // add_bos false is honoured as an explicit override.
  request.set_add_bos(false);
  const StreamResult without = RunGenerate(*stub, request);
  ASSERT_TRUE(without.status.ok());
  EXPECT_EQ(without.last.usage().prompt_tokens(), static_cast<int>(expected_tokens - 1));
}

TEST_F(OpenAiHttpTest, CurlChatIsRenderedThroughTheTemplate) {
  const std::vector<text::ChatMessage> conversation = {{"system", "You answer in one line."},
                                                       {"user", "What does the decode pool do?"}};
  const std::vector<int32_t> prompt = ChatPrompt(conversation);
  const Expected expected = Generate(prompt, 24);
  Json messages = Json::array();
  for (const auto& m : conversation) messages.push_back({{"role", m.role}, {"content", m.content}});
  const Json request = {
      {"model", "model"}, {"messages", messages}, {"max_tokens", 24}, {"temperature", 0}};
  HttpResult whole = Post("/v1/chat/completions", request.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json body = Json::parse(whole.body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], expected.text);
  EXPECT_EQ(body["choices"][0]["finish_reason"], expected.finish_reason);
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());

  Json stream_request = request;
  stream_request["stream"] = true;
  HttpResult stream = Post("/v1/chat/completions", stream_request.dump());
  ASSERT_EQ(stream.status, 200) << stream.body;
  const std::vector<std::string> events = SseData(stream.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const Json first = Json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json delta = Json::parse(events[i])["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(text, expected.text);
}

TEST_F(OpenAiHttpTest, CurlErrorsHaveOpenAiShapeAndAreCounted) {
  const double rejected_before = RouterMetric("pdserve_requests_total{finish_reason=\"rejected\"}");
  struct Case {
    std::string path;
    std::string body;
    int status;
    std::string param;  // "" for null
  };
  const std::string big(16 * 512 + 1, 'a');  // over the default --max_prompt_bytes
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"prompt\": ", 400, ""},
      {"/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {"/v1/completions", R"({"model": "gpt-4", "prompt": "x"})", 404, "model"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xC3\x28\"}]}",
       400, "messages[0].content"},
      {"/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})", 400,
       "messages[0].role"},
      {"/v1/completions", Json({{"prompt", big}, {"max_tokens", 1}}).dump(), 400, "prompt"},
  };
  for (const Case& c : cases) {
    HttpResult r = Post(c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 80) << " -> " << r.body;
    const Json body = Json::parse(r.body, nullptr, false);
    ASSERT_TRUE(body.contains("error")) << r.body;
    EXPECT_TRUE(body["error"]["message"].is_string());
    EXPECT_TRUE(body["error"]["type"].is_string());
    if (c.param.empty()) {
      EXPECT_TRUE(body["error"]["param"].is_null()) << r.body;
    } else {
      EXPECT_EQ(body["error"]["param"], c.param) << r.body;
    }
  }
  EXPECT_NE(Post("/v1/completions", cases.back().body).body.find("max_prompt_bytes"),
            std::string::npos);
  // Each refusal counted once (the last case was sent twice).
  EXPECT_EQ(RouterMetric("pdserve_requests_total{finish_reason=\"rejected\"}") - rejected_before,
            cases.size() + 1);
  // An unknown field is ignored; an unknown route is 404 in the same shape.
  HttpResult ok = Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2, "frobnicate": 1})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  HttpResult missing = Post("/v1/embeddings", R"({"input": "x"})");
  EXPECT_EQ(missing.status, 404);
  EXPECT_TRUE(Json::parse(missing.body).contains("error"));
}

TEST_F(OpenAiHttpTest, ConcurrentStreamsComplete) {
  constexpr int kStreams = 12;  // more than cpp-httplib's default pool of 8 threads here
  std::vector<HttpResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      const Json request = {{"prompt", Json::array({256, 65 + i, 66, 67})},
                            {"max_tokens", 30 + i},
                            {"ignore_eos", true},
                            {"seed", i},
                            {"stream", true}};
      results[i] = Curl(cluster_->router_http_port(), "/v1/completions", request.dump(),
                        absl::StrCat(*work_dir_, "/concurrent", i, ".json"));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_EQ(results[i].status, 200) << i << ": " << results[i].body;
    const std::vector<std::string> events = SseData(results[i].body);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events.back(), "[DONE]");
    EXPECT_EQ(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  }
  EXPECT_TRUE(WaitIdle());
}

TEST_F(OpenAiHttpTest, ClientThatHangsUpCancelsAndFreesKv) {
  ASSERT_TRUE(WaitIdle());
  const double cancelled_before =
      RouterMetric("pdserve_requests_total{finish_reason=\"cancelled\"}");
  // Long generations: they are still running when the client leaves.
  const Json request = {{"prompt", kPrompt}, {"max_tokens", 480}, {"ignore_eos", true}};
  Json streamed = request;
  streamed["stream"] = true;
  ASSERT_TRUE(PostAndHangUp(cluster_->router_http_port(), "/v1/completions", streamed.dump()).ok());
  ASSERT_TRUE(PostAndHangUp(cluster_->router_http_port(), "/v1/completions", request.dump()).ok());
  // curl leaving a stream: head closes the pipe after the first bytes.
  const CommandResult curl =
      RunCommand(absl::StrCat("curl -sS -N 'http://127.0.0.1:", cluster_->router_http_port(),
                              "/v1/completions' -H 'Content-Type: application/json' -d '",
                              streamed.dump(), "' 2>/dev/null | head -c 200 > /dev/null"));
  EXPECT_EQ(curl.exit_code, 0);
  EXPECT_TRUE(WaitIdle()) << "KV not freed after the clients left";
  EXPECT_EQ(RouterMetric("pdserve_requests_total{finish_reason=\"cancelled\"}") - cancelled_before,
            3);
}

TEST_F(OpenAiHttpTest, OfficialOpenAiClient) {
  const std::vector<text::ChatMessage> conversation = {{"user", "Tell me about the KV cache."}};
  const std::vector<int32_t> chat_prompt = ChatPrompt(conversation);
  const Expected completion = Generate(kPrompt, 20);
  const Expected chat = Generate(chat_prompt, 20);
  ASSERT_TRUE(WaitIdle());
  const double cancelled_before =
      RouterMetric("pdserve_requests_total{finish_reason=\"cancelled\"}");

  const Json config = {
      {"baseURL", absl::StrCat("http://127.0.0.1:", cluster_->router_http_port(), "/v1")},
      {"model", "model"},
      {"prompt", kPrompt},
      {"maxTokens", 20},
      {"messages", Json::array({{{"role", "user"}, {"content", conversation[0].content}}})},
      {"chatMaxTokens", 20},
      {"longMessages", Json::array({{{"role", "user"}, {"content", "Go on and on."}}})},
      {"longMaxTokens", 400}};
  const std::string config_path = *work_dir_ + "/openai_client.json";
  std::ofstream(config_path) << config.dump();
  const CommandResult run = RunCommand(
      absl::StrCat(PDSERVE_OPENAI_CLIENT_DIR, "/run_client.sh '", PDSERVE_OPENAI_CLIENT_DIR, "' '",
                   PDSERVE_OPENAI_CLIENT_WORK, "' '", config_path, "'"));
  if (run.exit_code == 77) GTEST_SKIP() << "node and npm are not installed";
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json out = Json::parse(run.output, nullptr, false);
  ASSERT_FALSE(out.is_discarded()) << run.output;

  EXPECT_EQ(out["models"], Json::array({"model"}));

  EXPECT_EQ(out["completion"]["object"], "text_completion");
  EXPECT_EQ(out["completion"]["text"], completion.text);
  EXPECT_EQ(out["completion"]["finish_reason"], completion.finish_reason);
  EXPECT_EQ(out["completion"]["usage"]["completion_tokens"], completion.tokens.size());
  EXPECT_EQ(out["completion"]["logprob_tokens"], completion.tokens.size());

  EXPECT_EQ(out["completion_stream"]["text"], completion.text);
  EXPECT_EQ(out["completion_stream"]["finish_reason"], completion.finish_reason);
  EXPECT_EQ(out["completion_stream"]["usage"]["prompt_tokens"], kPrompt.size());
  EXPECT_EQ(out["completion_stream"]["usage"]["completion_tokens"], completion.tokens.size());

  EXPECT_EQ(out["chat"]["object"], "chat.completion");
  EXPECT_EQ(out["chat"]["role"], "assistant");
  EXPECT_EQ(out["chat"]["text"], chat.text);
  EXPECT_EQ(out["chat"]["finish_reason"], chat.finish_reason);
  EXPECT_EQ(out["chat"]["usage"]["prompt_tokens"], chat_prompt.size());
  EXPECT_EQ(out["chat"]["logprobs"], chat.tokens.size());
  EXPECT_EQ(out["chat"]["top_logprobs"], 2);

  EXPECT_EQ(out["chat_stream"]["role"], "assistant");
  EXPECT_EQ(out["chat_stream"]["text"], chat.text);
  EXPECT_EQ(out["chat_stream"]["finish_reason"], chat.finish_reason);
  EXPECT_EQ(out["chat_stream"]["usage"]["completion_tokens"], chat.tokens.size());

  // n = 3 with a seed: three choices, the same whole and streamed.
  const Json& choices = out["choices"];
  ASSERT_EQ(choices["whole"]["choices"].size(), 3u) << choices.dump();
  EXPECT_EQ(choices["stream"]["choices"], choices["whole"]["choices"]);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(choices["whole"]["choices"][i]["index"], i);
    EXPECT_EQ(choices["whole"]["choices"][i]["finish_reason"], "length");
  }
  EXPECT_NE(choices["whole"]["choices"][0]["content"], choices["whole"]["choices"][1]["content"]);
  EXPECT_EQ(choices["whole"]["usage"]["prompt_tokens"], chat_prompt.size());
  EXPECT_EQ(choices["whole"]["usage"]["completion_tokens"], 3 * 20);
  EXPECT_EQ(choices["stream"]["usage"], choices["whole"]["usage"]);

  EXPECT_EQ(out["bad_type"]["status"], 400);
  EXPECT_EQ(out["bad_type"]["param"], "temperature");
  EXPECT_EQ(out["bad_role"]["status"], 400);
  EXPECT_EQ(out["bad_role"]["param"], "messages[0].role");
  EXPECT_EQ(out["unknown_model"]["status"], 404);
  EXPECT_EQ(out["unknown_model"]["name"], "NotFoundError");

  EXPECT_EQ(out["aborted_after_chunks"], 3);
  EXPECT_TRUE(WaitIdle()) << "KV not freed after the client aborted";
  // The router counts the request when its session sees the hang-up, which
  // may come after the workers have freed the KV: polled, bounded.
  const auto cancelled = [&] {
    return RouterMetric("pdserve_requests_total{finish_reason=\"cancelled\"}") - cancelled_before;
  };
  PollUntil([&] { return cancelled() >= 1; }, kGenerousDeadline, absl::Milliseconds(25));
  EXPECT_EQ(cancelled(), 1);
}

// Admission and empty pools, as HTTP statuses.
TEST(OpenAiHttpLimitsTest, FullIs429AndEmptyPoolIs503) {
  const std::string work_dir = ::testing::TempDir() + "/pdserve_openai_limits_test";
  std::filesystem::remove_all(work_dir);
  std::filesystem::create_directories(work_dir);
  engine::ModelConfig config = engine::DefaultDemoConfig();
  config.max_position_embeddings = 256;
  ASSERT_TRUE(engine::WriteRandomModel(config, 3, "f32", work_dir + "/model").ok());
  const std::string body = R"({"prompt": [1, 2, 3], "max_tokens": 2})";
  {
    LocalCluster cluster(ClusterOptions{.model_dir = work_dir + "/model",
                                        .work_dir = work_dir,
                                        .num_prefill = 0,
                                        .num_decode = 0,
                                        .router_flags = {"--max_in_flight=0"}});
    ASSERT_TRUE(cluster.Start().ok());
    HttpResult r = Curl(cluster.router_http_port(), "/v1/completions", body, work_dir + "/b.json");
    EXPECT_EQ(r.status, 429) << r.body;
    EXPECT_EQ(Json::parse(r.body)["error"]["code"], "rate_limit_exceeded");
  }
  LocalCluster cluster(ClusterOptions{
      .model_dir = work_dir + "/model", .work_dir = work_dir, .num_prefill = 0, .num_decode = 0});
  ASSERT_TRUE(cluster.Start().ok());
  HttpResult r = Curl(cluster.router_http_port(), "/v1/completions", body, work_dir + "/b.json");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("no live decode worker"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::testing
