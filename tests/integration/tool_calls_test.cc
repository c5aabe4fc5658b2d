// Tool calls end to end on a random-weight model whose chat template is
// Hermes style (<tool_call> blocks, as Qwen's): the official `openai` client
// runs two-turn tool loops (tool_choice "required" and a named function,
// then the answer with tool_choice "none"), streamed and not, on a
// disaggregated cluster (format read from the template) and on the colocated
// server (--tool_call_parser=llama3_json). Every call's arguments are
// checked by Ajv against the tool's parameters (tests/openai_client/tool_calls.mjs).
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/model/config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/demo_chat_model.h"
#include "tests/integration/http_client.h"
#include "tests/integration/local_cluster.h"

namespace pdserve::testing {
namespace {

using Json = nlohmann::json;

// Qwen 2.5's tool layout, in the subset every Hermes-style template shares.
constexpr char kHermesTemplate[] = R"({%- if tools %}<|im_start|>system
You may call functions. Signatures:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Answer with <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for tool_call in message.tool_calls %}
<tool_call>
{"name": "{{ tool_call.function.name }}", "arguments": {{ tool_call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %})";

class ToolCallsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_dir_ = new std::string(::testing::TempDir() + "/pdserve_tool_calls_test");
    std::filesystem::remove_all(*work_dir_);
    std::filesystem::create_directories(*work_dir_);
    model_dir_ = new std::string(*work_dir_ + "/model");
    ASSERT_TRUE(WriteDemoChatModel(*model_dir_, 2048, /*seed=*/17).ok());
    // The demo tokenizer with a Hermes-style template.
    const std::string config_path = *model_dir_ + "/tokenizer_config.json";
    Json tokenizer_config = Json::parse(std::ifstream(config_path));
    tokenizer_config["chat_template"] = kHermesTemplate;
    std::ofstream(config_path) << tokenizer_config.dump(2);
  }
  static void TearDownTestSuite() {}

  // Runs tool_calls.mjs against `port`; a discarded Json when it failed.
  static Json RunLoops(int port, const std::string& name, bool* skipped) {
    const Json config = {{"baseURL", absl::StrCat("http://127.0.0.1:", port, "/v1")},
                         {"model", "model"},
                         {"maxTokens", 120},
                         {"seed", 31}};
    const CommandResult run =
        RunOpenAiClientScript(PDSERVE_OPENAI_CLIENT_DIR, PDSERVE_OPENAI_CLIENT_WORK, config,
                              absl::StrCat(*work_dir_, "/", name, ".json"), "tool_calls.mjs");
    *skipped = run.exit_code == 77;
    if (*skipped) return Json(Json::value_t::discarded);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    const Json out = Json::parse(run.output, nullptr, false);
    EXPECT_FALSE(out.is_discarded()) << run.output;
    return out;
  }

  static void ExpectLoops(const Json& out) {
    ASSERT_EQ(out["loops"].size(), 12u) << out.dump();
    for (const Json& loop : out["loops"]) {
      const Json& first = loop["first"];
      const std::string where = absl::StrCat("stream ", loop["stream"].dump(), " choice ",
                                             loop["choice"].dump(), ": ", first.dump());
      EXPECT_EQ(first["finish_reason"], "tool_calls") << where;
      ASSERT_GE(first["calls"].size(), 1u) << where;
      for (const Json& call : first["calls"]) {
        EXPECT_EQ(call["valid"], true) << where;
        EXPECT_EQ(call["type"], "function") << where;
        EXPECT_TRUE(absl::StartsWith(call["id"].get<std::string>(), "call_")) << where;
        if (loop["choice"].is_object()) {
          EXPECT_EQ(call["name"], "get_time") << where;
        }
      }
      if (loop["stream"] == true) {
        // Every streamed call's arguments come in argument deltas. How many
        // pieces is timing: tokens that reach the session together go out as
        // one delta, so on a busy machine a call's arguments may arrive
        // whole. That they stream as they are generated is asserted without
        // timing by the unit tests (ToolCallsTest.*Stream*, tests/unit).
        EXPECT_GE(first["argument_deltas"].get<int>(), static_cast<int>(first["calls"].size()))
            << where;
      }
      // The answer turn (tool_choice none) is plain content.
      const Json& second = loop["second"];
      EXPECT_TRUE(second["calls"].empty()) << second.dump();
      EXPECT_TRUE(second["finish_reason"] == "stop" || second["finish_reason"] == "length")
          << second.dump();
    }
    const Json& auto_reply = out["auto"];
    for (const Json& call : auto_reply["calls"])
      EXPECT_EQ(call["valid"], true) << auto_reply.dump();
    EXPECT_EQ(auto_reply["finish_reason"] == "tool_calls", !auto_reply["calls"].empty())
        << auto_reply.dump();
    EXPECT_EQ(out["unknown_tool"]["status"], 400);
    EXPECT_EQ(out["unknown_tool"]["param"], "tool_choice.function.name");
    EXPECT_EQ(out["with_format"]["status"], 400);
    EXPECT_EQ(out["with_format"]["param"], "tool_choice");
  }

  static std::string* work_dir_;
  static std::string* model_dir_;
};
std::string* ToolCallsTest::work_dir_ = nullptr;
std::string* ToolCallsTest::model_dir_ = nullptr;

TEST_F(ToolCallsTest, HermesLoopsOnADisaggregatedCluster) {
  LocalCluster cluster(ClusterOptions{.model_dir = *model_dir_, .work_dir = *work_dir_});
  absl::Status s = cluster.Start();
  ASSERT_TRUE(s.ok()) << s;
  bool skipped = false;
  const Json out = RunLoops(cluster.router_http_port(), "hermes", &skipped);
  if (skipped) GTEST_SKIP() << "node and npm are not installed";
  ASSERT_FALSE(out.is_discarded());
  ExpectLoops(out);
}

TEST_F(ToolCallsTest, Llama3JsonLoopsOnTheColocatedServer) {
  const std::string ready = *work_dir_ + "/colocated.ready";
  Subprocess server;
  ASSERT_TRUE(
      server
          .Start({PDSERVE_COLOCATED_BIN, "--model_dir=" + *model_dir_, "--threads=1",
                  "--num_kv_blocks=512", "--tool_call_parser=llama3_json", "--ready_file=" + ready},
                 *work_dir_ + "/colocated.log")
          .ok());
  auto fields = server.WaitReady(ready, absl::Seconds(60));
  ASSERT_TRUE(fields.ok()) << fields.status();
  int http_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi((*fields)["http_port"], &http_port));
  bool skipped = false;
  const Json out = RunLoops(http_port, "llama3_json", &skipped);
  if (skipped) GTEST_SKIP() << "node and npm are not installed";
  ASSERT_FALSE(out.is_discarded());
  ExpectLoops(out);
}

}  // namespace
}  // namespace pdserve::testing
