// Structured output end to end on random-weight models, where unconstrained
// output almost never parses: a disaggregated cluster (router, prefill
// worker sampling the first token, decode worker every later one) and the
// colocated server, through the official `openai` client (completions and
// chat, streamed and not, chat.completions.parse) and over gRPC
// (SamplingParams.response_format). Every reply is checked against its
// schema by the Ajv validator (tests/openai_client/structured_output.mjs).
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_util.h"
#include "engine/model/config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/demo_chat_model.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/http_client.h"
#include "tests/integration/local_cluster.h"

namespace pdserve::testing {
namespace {

using Json = nlohmann::json;

const std::vector<int32_t> kPrompt = {256, 84, 104, 101, 32, 99, 97, 99, 104, 101};
constexpr int kMaxTokens = 160;

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_dir_ = new std::string(::testing::TempDir() + "/pdserve_structured_output_test");
    std::filesystem::remove_all(*work_dir_);
    std::filesystem::create_directories(*work_dir_);
    model_dir_ = new std::string(*work_dir_ + "/model");
    ASSERT_TRUE(WriteDemoChatModel(*model_dir_, 512, /*seed=*/11).ok());
    cluster_ = new LocalCluster(ClusterOptions{.model_dir = *model_dir_, .work_dir = *work_dir_});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_GT(cluster_->router_http_port(), 0);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  // Runs structured_output.mjs with `config`; nullopt-like: a discarded
  // Json when it failed (the failure is recorded), or skips without node.
  static Json RunClient(const Json& config, const std::string& name, bool* skipped) {
    const CommandResult run = RunOpenAiClientScript(
        PDSERVE_OPENAI_CLIENT_DIR, PDSERVE_OPENAI_CLIENT_WORK, config,
        absl::StrCat(*work_dir_, "/", name, ".json"), "structured_output.mjs");
    *skipped = run.exit_code == 77;
    if (*skipped) return Json(Json::value_t::discarded);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    const Json out = Json::parse(run.output, nullptr, false);
    EXPECT_FALSE(out.is_discarded()) << run.output;
    return out;
  }

  static Json HttpConfig(int port, int count, int unconstrained, uint32_t seed) {
    return Json{{"baseURL", absl::StrCat("http://127.0.0.1:", port, "/v1")},
                {"model", "model"},
                {"count", count},
                {"unconstrained", unconstrained},
                {"seed", seed},
                {"maxTokens", kMaxTokens},
                {"concurrency", 6},
                {"prompt", kPrompt},
                {"messages", Json::array({{{"role", "user"}, {"content", "Describe a thing."}}})}};
  }

  // Every constrained reply parses, validates and ends as STOP; the
  // unconstrained ones (same schemas and seeds) almost never validate.
  static void ExpectAllValid(const Json& out, size_t count) {
    ASSERT_EQ(out["cases"].size(), count);
    int invalid = 0;
    for (const Json& c : out["cases"]) {
      if (c["valid"] != true || c["finish_reason"] != "stop") {
        if (++invalid <= 5) {
          ADD_FAILURE() << "api " << c["api"] << " stream " << c["stream"] << " seed " << c["seed"]
                        << "\nschema: " << c["schema"].dump() << "\ntext: " << c["text"]
                        << "\nfinish: " << c["finish_reason"] << "\nerror: " << c["error"];
        }
      }
      if (c.contains("parsed_matches")) EXPECT_EQ(c["parsed_matches"], true);
    }
    EXPECT_EQ(invalid, 0) << "of " << count;
    int unconstrained_valid = 0;
    for (const Json& u : out["unconstrained"]) unconstrained_valid += u["valid"] == true;
    EXPECT_LE(unconstrained_valid * 10, static_cast<int>(out["unconstrained"].size()))
        << "a random model's output validated too often: the test would prove nothing";
  }

  // `cases` ({schema, text}) through the validator only.
  static Json Validate(const Json& cases, bool* skipped) {
    return RunClient(Json{{"mode", "validate"}, {"cases", cases}}, "validate", skipped);
  }

  static std::string* work_dir_;
  static std::string* model_dir_;
  static LocalCluster* cluster_;
};
std::string* StructuredOutputTest::work_dir_ = nullptr;
std::string* StructuredOutputTest::model_dir_ = nullptr;
LocalCluster* StructuredOutputTest::cluster_ = nullptr;

// gRPC requests with response_format for `schemas`, each with its own seed;
// returns {schema, text} cases for the validator.
Json GrpcCases(v1::Generation::Stub& stub, const Json& schemas, uint64_t seed) {
  Json cases = Json::array();
  for (const Json& schema : schemas) {
    v1::GenerateRequest request = TokenRequest(kPrompt, kMaxTokens);
    request.mutable_sampling()->set_temperature(1.0f);
    request.mutable_sampling()->set_seed(seed++);
    auto* format = request.mutable_sampling()->mutable_response_format();
    if (schema == Json{{"type", "object"}}) {
      format->set_json_object(true);
    } else {
      format->mutable_json_schema()->set_schema(schema.dump());
      format->mutable_json_schema()->set_strict(seed % 2 == 0);
    }
    const StreamResult got = RunGenerate(stub, request, absl::Seconds(120));
    EXPECT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.last.finish_reason(), v1::FINISH_REASON_STOP) << got.text;
    cases.push_back({{"schema", schema}, {"text", got.text}});
  }
  return cases;
}

TEST_F(StructuredOutputTest, DisaggregatedRepliesValidateOverHttpAndGrpc) {
  bool skipped = false;
  constexpr int kCount = 200;
  const Json out = RunClient(HttpConfig(cluster_->router_http_port(), kCount, 40, 23),
                             "disaggregated", &skipped);
  if (skipped) GTEST_SKIP() << "node and npm are not installed";
  ASSERT_FALSE(out.is_discarded());
  ExpectAllValid(out, kCount);
  // A keyword the grammar cannot enforce: 400 naming it.
  EXPECT_EQ(out["refusal"]["status"], 400) << out["refusal"].dump();
  EXPECT_NE(out["refusal"]["message"].get<std::string>().find("pattern"), std::string::npos)
      << out["refusal"].dump();

  // The first 30 schemas again over gRPC, with other seeds.
  Json schemas = Json::array();
  for (int i = 0; i < 30; ++i) schemas.push_back(out["cases"][i]["schema"]);
  auto stub = cluster_->NewClient();
  const Json cases = GrpcCases(*stub, schemas, 7000);
  const Json checked = Validate(cases, &skipped);
  ASSERT_FALSE(checked.is_discarded());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(checked["results"][i]["valid"], true)
        << cases[i].dump() << ": " << checked["results"][i].dump();
  }

  // Over gRPC, an unsupported keyword is INVALID_ARGUMENT naming it.
  v1::GenerateRequest bad = TokenRequest(kPrompt, 16);
  bad.mutable_sampling()->mutable_response_format()->mutable_json_schema()->set_schema(
      R"({"type": "string", "minLength": 2})");
  const StreamResult refused = RunGenerate(*stub, bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("minLength"), std::string::npos)
      << refused.status.error_message();

  // Every token after the first was the decode worker's.
  auto text = HttpGet(cluster_->decode()[0]->metrics_port, "/metrics");
  ASSERT_TRUE(text.ok());
  EXPECT_GE(MetricValue(*text, "pdserve_decode_generation_tokens_total"), kCount);
}

TEST_F(StructuredOutputTest, ColocatedRepliesValidate) {
  const std::string ready = *work_dir_ + "/colocated.ready";
  Subprocess server;
  ASSERT_TRUE(server
                  .Start({PDSERVE_COLOCATED_BIN, "--model_dir=" + *model_dir_, "--threads=1",
                          "--num_kv_blocks=512", "--ready_file=" + ready},
                         *work_dir_ + "/colocated.log")
                  .ok());
  auto fields = server.WaitReady(ready, absl::Seconds(60));
  ASSERT_TRUE(fields.ok()) << fields.status();
  int http_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi((*fields)["http_port"], &http_port));
  bool skipped = false;
  constexpr int kCount = 40;
  const Json out = RunClient(HttpConfig(http_port, kCount, 0, 99), "colocated", &skipped);
  if (skipped) GTEST_SKIP() << "node and npm are not installed";
  ASSERT_FALSE(out.is_discarded());
  ExpectAllValid(out, kCount);

  Json schemas = Json::array();
  for (int i = 0; i < 10; ++i) schemas.push_back(out["cases"][i]["schema"]);
  auto stub = v1::Generation::NewStub(MakeChannel((*fields)["grpc_address"]));
  const Json cases = GrpcCases(*stub, schemas, 9000);
  const Json checked = Validate(cases, &skipped);
  ASSERT_FALSE(checked.is_discarded());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(checked["results"][i]["valid"], true)
        << cases[i].dump() << ": " << checked["results"][i].dump();
  }
}

}  // namespace
}  // namespace pdserve::testing
