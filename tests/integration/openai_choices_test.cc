// OpenAI `n` > 1 on a real local cluster (router, two prefill workers, a
// decode worker on loopback): the choices share the prompt's prefill
// through the prefill worker's prefix cache, each follows its own seed
// (choice i with seed s is the single choice with seed s + i), usage counts
// the prompt once, and a client that leaves cancels every choice.
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/demo_chat_model.h"
#include "tests/integration/http_client.h"
#include "tests/integration/local_cluster.h"
#include "tests/util/poll.h"

namespace pdserve::testing {
namespace {

using Json = nlohmann::json;

constexpr int kBlockSize = 16;  // the prefill workers' --kv_block_size default

class OpenAiChoicesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_dir_ = new std::string(::testing::TempDir() + "/pdserve_openai_choices_test");
    std::filesystem::remove_all(*work_dir_);
    std::filesystem::create_directories(*work_dir_);
    const std::string model_dir = *work_dir_ + "/model";
    ASSERT_TRUE(WriteDemoChatModel(model_dir, 512, /*seed=*/9).ok());
    cluster_ = new LocalCluster(ClusterOptions{.model_dir = model_dir,
                                               .work_dir = *work_dir_,
                                               .num_prefill = 2,
                                               .num_decode = 1,
                                               .router_flags = {"--max_in_flight=6", "--max_n=8"}});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  HttpResult Post(const std::string& path, const Json& body) {
    return Curl(cluster_->router_http_port(), path, body.dump(), *work_dir_ + "/body.json");
  }
  static double Metric(int port, const std::string& name) {
    auto text = HttpGet(port, "/metrics");
    return text.ok() ? MetricValue(*text, name) : -1;
  }
  // Prompt tokens the prefill workers found cached, all together.
  static double PrefixHits() {
    double hits = 0;
    for (auto& p : cluster_->prefill()) {
      hits += Metric(p->metrics_port, "pdserve_prefix_cache_hits_total");
    }
    return hits;
  }
  static bool WaitIdle() {
    return PollUntil(
        [&] {
          return Metric(cluster_->decode()[0]->metrics_port, "pdserve_kv_cache_usage_ratio") == 0 &&
                 Metric(cluster_->router_metrics_port(), "pdserve_requests_in_flight") == 0;
        },
        kGenerousDeadline, absl::Milliseconds(50));
  }
  static double Cancelled() {
    return Metric(cluster_->router_metrics_port(),
                  "pdserve_requests_total{finish_reason=\"cancelled\"}");
  }

  static std::string* work_dir_;
  static LocalCluster* cluster_;
};
std::string* OpenAiChoicesTest::work_dir_ = nullptr;
LocalCluster* OpenAiChoicesTest::cluster_ = nullptr;

// A prompt no other test sends (so nothing of it is cached before).
std::vector<int> Prompt(int size, int salt) {
  std::vector<int> prompt;
  for (int i = 0; i < size; ++i) prompt.push_back(32 + (i * 7 + salt * 13) % 220);
  return prompt;
}

TEST_F(OpenAiChoicesTest, StreamedChoicesSharePrefillAndFollowTheirSeeds) {
  ASSERT_TRUE(WaitIdle());
  const std::vector<int> prompt = Prompt(70, 1);
  const Json request = {{"prompt", prompt},   {"max_tokens", 12},
                        {"ignore_eos", true}, {"temperature", 1.0},
                        {"seed", 11},         {"n", 3},
                        {"stream", true},     {"stream_options", {{"include_usage", true}}}};
  const double hits_before = PrefixHits();
  HttpResult stream = Post("/v1/completions", request);
  ASSERT_EQ(stream.status, 200) << stream.body;
  // Choice 0 computed the prompt; the two others found its full blocks
  // (those before the last token) cached: 4 blocks of 16 each.
  const int cached = (static_cast<int>(prompt.size()) - 1) / kBlockSize * kBlockSize;
  EXPECT_EQ(PrefixHits() - hits_before, 2 * cached);

  const std::vector<std::string> events = SseData(stream.body);
  ASSERT_GE(events.size(), 5u) << stream.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::map<int, std::string> text, finish;
  Json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json chunk = Json::parse(events[i]);
    EXPECT_TRUE(usage.is_null()) << "the usage chunk comes last";
    if (!chunk["usage"].is_null()) usage = chunk["usage"];
    if (chunk["choices"].empty()) continue;
    ASSERT_EQ(chunk["choices"].size(), 1u);
    const Json& choice = chunk["choices"][0];
    const int index = choice["index"];
    ASSERT_TRUE(index >= 0 && index < 3) << chunk;
    EXPECT_FALSE(finish.contains(index)) << "a chunk after its choice finished";
    text[index] += choice["text"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish[index] = choice["finish_reason"];
  }
  ASSERT_EQ(text.size(), 3u);
  ASSERT_EQ(finish.size(), 3u);
  EXPECT_EQ(usage["prompt_tokens"], prompt.size());
  EXPECT_EQ(usage["completion_tokens"], 3 * 12);
  EXPECT_EQ(usage["total_tokens"], prompt.size() + 3 * 12);
  EXPECT_NE(text[0], text[1]);
  EXPECT_NE(text[1], text[2]);
  EXPECT_NE(text[0], text[2]);
  // Choice i is what one choice with seed 11 + i generates.
  for (int i = 0; i < 3; ++i) {
    Json single = request;
    single.erase("n");
    single.erase("stream");
    single.erase("stream_options");
    single["seed"] = 11 + i;
    HttpResult r = Post("/v1/completions", single);
    ASSERT_EQ(r.status, 200) << r.body;
    const Json body = Json::parse(r.body);
    EXPECT_EQ(body["choices"][0]["text"], text[i]) << "choice " << i;
    EXPECT_EQ(body["choices"][0]["finish_reason"], finish[i]);
  }
  EXPECT_TRUE(WaitIdle());
}

TEST_F(OpenAiChoicesTest, WholeChatResponseWithSeveralChoices) {
  ASSERT_TRUE(WaitIdle());
  const Json messages = Json::array({{{"role", "user"}, {"content", "Name three colours."}}});
  const Json request = {{"messages", messages}, {"max_tokens", 8}, {"ignore_eos", true},
                        {"temperature", 1.0},   {"seed", 5},       {"n", 2}};
  HttpResult r = Post("/v1/chat/completions", request);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json body = Json::parse(r.body);
  EXPECT_EQ(body["object"], "chat.completion");
  ASSERT_EQ(body["choices"].size(), 2u) << body;
  int prompt_tokens = 0;
  for (int i = 0; i < 2; ++i) {
    const Json& choice = body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["message"]["role"], "assistant");
    EXPECT_EQ(choice["finish_reason"], "length");
    Json single = request;
    single.erase("n");
    single["seed"] = 5 + i;
    HttpResult one = Post("/v1/chat/completions", single);
    ASSERT_EQ(one.status, 200) << one.body;
    const Json one_body = Json::parse(one.body);
    EXPECT_EQ(one_body["choices"][0]["message"]["content"], choice["message"]["content"]);
    prompt_tokens = one_body["usage"]["prompt_tokens"];
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(body["usage"]["completion_tokens"], 16);
  EXPECT_EQ(body["usage"]["total_tokens"], prompt_tokens + 16);
}

TEST_F(OpenAiChoicesTest, CapsAndAdmissionCountEveryChoice) {
  ASSERT_TRUE(WaitIdle());
  const Json base = {{"prompt", Prompt(8, 2)}, {"max_tokens", 2}};
  Json over_cap = base;
  over_cap["n"] = 9;  // --max_n=8
  HttpResult r = Post("/v1/completions", over_cap);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "n");
  Json best_of = base;
  best_of["best_of"] = 2;
  r = Post("/v1/completions", best_of);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "best_of");
  // Seven choices are seven sequences: more than --max_in_flight=6.
  Json too_many = base;
  too_many["n"] = 7;
  r = Post("/v1/completions", too_many);
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(r.body.find("7 choices"), std::string::npos) << r.body;
  Json fits = base;
  fits["n"] = 6;
  r = Post("/v1/completions", fits);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["choices"].size(), 6u);
}

TEST_F(OpenAiChoicesTest, ClientThatLeavesCancelsEveryChoice) {
  ASSERT_TRUE(WaitIdle());
  const double cancelled_before = Cancelled();
  const Json request = {
      {"prompt", Prompt(20, 3)}, {"max_tokens", 400}, {"ignore_eos", true}, {"n", 3}, {"seed", 1},
      {"stream", true}};
  // The stream begins once every choice has produced output; curl then
  // leaves after its first bytes.
  const CommandResult curl =
      RunCommand(absl::StrCat("curl -sS -N 'http://127.0.0.1:", cluster_->router_http_port(),
                              "/v1/completions' -H 'Content-Type: application/json' -d '",
                              request.dump(), "' 2>/dev/null | head -c 300 > /dev/null"));
  EXPECT_EQ(curl.exit_code, 0);
  EXPECT_TRUE(WaitIdle()) << "KV not freed after the client left";
  EXPECT_EQ(Cancelled() - cancelled_before, 3);
}

}  // namespace
}  // namespace pdserve::testing
