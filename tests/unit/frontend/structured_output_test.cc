// Structured output from the client's request to the worker's constraint:
// OpenAI response_format and pdserve.v1 ResponseFormat into the grammar spec,
// the front end's checks (unsupported keywords named, max_tokens), and the
// worker side (SamplingForWorker) compiling it over a tokenizer's vocabulary
// and continuing after tokens another worker generated.
#include "frontend/structured_output.h"

#include <filesystem>
#include <string>
#include <vector>

#include "engine/runtime/grammar/grammar_spec.h"
#include "engine/runtime/grammar/tokenizer_vocabulary.h"
#include "engine/runtime/sampler.h"
#include "frontend/errors.h"
#include "frontend/generate_request_proto.h"
#include "frontend/openai_protocol.h"
#include "frontend/request_validation.h"
#include "frontend/sampling_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer_loader.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::frontend {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);
const openai::ParseOptions kOptions{.model_name = "demo", .add_bos = true};

PromptSource ByteSource() {
  PromptSource source;
  source.config.architecture = "LlamaForCausalLM";
  source.config.vocab_size = 300;
  source.config.max_position_embeddings = 256;
  source.config.bos_token_id = 256;
  source.config.eos_token_ids = {257};
  source.tokenizer = std::make_unique<text::ByteTokenizer>(300);
  return source;
}

absl::StatusOr<ValidatedRequest> ValidateOpenAi(openai::Api api, const std::string& body) {
  absl::StatusOr<openai::ParsedRequest> p = openai::ParseRequest(api, body, kOptions);
  if (!p.ok()) return p.status();
  return ValidateRequest(p->request, ByteSource(), {}, kNow, 1);
}

TEST(StructuredOutputTest, OpenAiResponseFormats) {
  // text: no grammar.
  auto v = ValidateOpenAi(openai::Api::kCompletions,
                          R"({"prompt": "x", "response_format": {"type": "text"}})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->sampling.grammar_spec, "");

  v = ValidateOpenAi(
      openai::Api::kCompletions,
      R"({"prompt": "x", "max_tokens": 8, "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->sampling.grammar_spec, engine::grammar::JsonObjectSpec().dump());

  v = ValidateOpenAi(openai::Api::kCompletions, R"({"prompt": "x", "max_tokens": 64,
      "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                   "required": ["a"]}}}})");
  ASSERT_TRUE(v.ok()) << v.status();
  const Json spec = Json::parse(v->sampling.grammar_spec);
  EXPECT_EQ(spec["strict"], true);
  EXPECT_EQ(spec["json_schema"]["required"][0], "a");
}

TEST(StructuredOutputTest, RefusalsNameTheField) {
  struct Case {
    std::string response_format;
    std::string field;
    std::string detail;
  };
  const std::vector<Case> cases = {
      {R"("json")", "response_format", "object"},
      {R"({"type": "yaml"})", "response_format.type", "yaml"},
      {R"({"type": "json_schema"})", "response_format.json_schema", "schema"},
      {R"({"type": "json_schema", "json_schema": {"schema": 3}})",
       "response_format.json_schema.schema", "JSON Schema"},
      {R"({"type": "json_schema", "json_schema": {"strict": "yes", "schema": {}}})",
       "response_format.json_schema.strict", "true or false"},
      // The grammar cannot enforce a pattern: a 400 naming the keyword.
      {R"({"type": "json_schema", "json_schema": {"schema":
          {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$"}}}}})",
       "response_format", "pattern"},
  };
  for (const Case& c : cases) {
    auto v = ValidateOpenAi(openai::Api::kCompletions,
                            absl::StrCat(R"({"prompt": "x", "max_tokens": 64, "response_format": )",
                                         c.response_format, "}"));
    ASSERT_FALSE(v.ok()) << c.response_format;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << c.response_format;
    EXPECT_EQ(ErrorField(v.status()), c.field) << v.status();
    EXPECT_THAT(v.status().message(), HasSubstr(c.detail)) << c.response_format;
  }
  // max_tokens below what the shortest output needs ("{}" is 2 bytes).
  auto v = ValidateOpenAi(openai::Api::kCompletions,
                          R"({"prompt": "x", "max_tokens": 1,
                              "response_format": {"type": "json_object"}})");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(ErrorField(v.status()), "max_tokens") << v.status();
  // The grammar decides where the output ends.
  v = ValidateOpenAi(openai::Api::kCompletions,
                     R"({"prompt": "x", "max_tokens": 8, "ignore_eos": true,
                         "response_format": {"type": "json_object"}})");
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr("ignore_eos"));
}

TEST(StructuredOutputTest, GrpcResponseFormat) {
  v1::GenerateRequest r;
  r.set_text("x");
  r.mutable_sampling()->set_max_tokens(32);
  r.mutable_sampling()->mutable_response_format()->mutable_json_schema()->set_schema(
      R"({"enum": ["red", "green"]})");
  absl::StatusOr<Request> native = RequestFromProto(r);
  ASSERT_TRUE(native.ok()) << native.status();
  auto v = ValidateRequest(*native, ByteSource(), {}, kNow, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(Json::parse(v->sampling.grammar_spec)["json_schema"]["enum"][1], "green");
  // The wire carries the spec to the worker as it is.
  EXPECT_EQ(SamplingFromProto(SamplingToProto(v->sampling)).grammar_spec, v->sampling.grammar_spec);

  r.mutable_sampling()->mutable_response_format()->mutable_json_schema()->set_schema("{bad");
  native = RequestFromProto(r);
  ASSERT_FALSE(native.ok());
  EXPECT_EQ(ErrorField(native.status()), "sampling.response_format.json_schema.schema");

  r.mutable_sampling()->mutable_response_format()->mutable_json_schema()->set_schema(
      R"({"type": "string", "minLength": 3})");
  native = RequestFromProto(r);
  ASSERT_TRUE(native.ok());
  v = ValidateRequest(*native, ByteSource(), {}, kNow, 1);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(ErrorField(v.status()), "sampling.response_format");
  EXPECT_THAT(v.status().message(), HasSubstr("minLength"));

  r.mutable_sampling()->mutable_response_format()->set_json_object(true);
  native = RequestFromProto(r);
  ASSERT_TRUE(native.ok());
  EXPECT_EQ(native->sampling.grammar_spec, engine::grammar::JsonObjectSpec().dump());
}

// The demo tokenizer's vocabulary (bytes 0..255, specials, merges).
std::unique_ptr<engine::grammar::GrammarCompiler> DemoCompiler(engine::ModelConfig* config) {
  const std::string dir = ::testing::TempDir() + "/structured_output_vocab";
  std::filesystem::create_directories(dir);
  EXPECT_TRUE(engine::WriteDemoTokenizer(300, dir).ok());
  config->vocab_size = 300;
  config->eos_token_ids = {engine::kDemoEndOfTextId};
  auto compiler = engine::grammar::CreateGrammarCompiler(dir, *config);
  EXPECT_TRUE(compiler.ok()) << compiler.status();
  return compiler.ok() ? *std::move(compiler) : nullptr;
}

// A worker process's compiler: over the model's tokenizer, or none (after
// a warning) where the model directory has no tokenizer to load.
TEST(StructuredOutputTest, AWorkerWithoutATokenizerStartsWithoutStructuredOutput) {
  engine::ModelConfig config;
  config.vocab_size = 300;
  const std::string bare = ::testing::TempDir() + "/structured_output_no_tokenizer";
  std::filesystem::remove_all(bare);
  std::filesystem::create_directories(bare);
  EXPECT_EQ(engine::grammar::WorkerGrammarCompiler(bare, config), nullptr);
  ASSERT_TRUE(engine::WriteDemoTokenizer(300, bare).ok());
  std::unique_ptr<engine::grammar::GrammarCompiler> compiler =
      engine::grammar::WorkerGrammarCompiler(bare, config);
  ASSERT_NE(compiler, nullptr);
  EXPECT_EQ(compiler->vocab().size(), 300);
  EXPECT_TRUE(compiler->Compile(engine::grammar::JsonObjectSpec().dump()).ok());
}

std::vector<uint32_t> MaskAfter(const engine::SamplingParams& p, std::vector<int32_t> generated,
                                int vocab) {
  std::vector<uint32_t> mask;
  engine::FillConstraintMask(p, engine::TokenHistory{.generated = generated},
                             std::vector<int>{engine::kDemoEndOfTextId}, vocab, mask);
  return mask;
}

TEST(StructuredOutputTest, WorkerCompilesAndContinuesAfterAnotherWorkersTokens) {
  engine::ModelConfig config;
  auto compiler = DemoCompiler(&config);
  ASSERT_NE(compiler, nullptr);
  // Specials never carry text.
  EXPECT_EQ(compiler->vocab().bytes(engine::kDemoBosId), "");
  EXPECT_EQ(compiler->vocab().bytes('{'), "{");

  engine::SamplingParams params;
  params.max_tokens = 16;
  params.grammar_spec =
      engine::grammar::JsonSchemaSpec(Json::parse(R"({"enum": ["ab", "cd"]})"), false).dump();
  internal::v1::WorkerSampling wire = SamplingToProto(params);

  // The prefill worker: the first token must be the opening quote.
  absl::StatusOr<engine::SamplingParams> first = SamplingForWorker(wire, {}, compiler.get());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(first->constraint, nullptr);
  std::vector<uint32_t> mask = MaskAfter(*first, {}, 300);
  EXPECT_TRUE(engine::TokenAllowed(mask, '"'));
  EXPECT_FALSE(engine::TokenAllowed(mask, 'a'));
  EXPECT_FALSE(engine::TokenAllowed(mask, engine::kDemoEndOfTextId));

  // The decode worker gets a fresh constraint and the tokens so far: after
  // "\"c" only 'd' may follow; after the whole value only the end.
  const std::vector<int32_t> kSoFar = {'"', 'c'};
  absl::StatusOr<engine::SamplingParams> next = SamplingForWorker(wire, kSoFar, compiler.get());
  ASSERT_TRUE(next.ok()) << next.status();
  mask = MaskAfter(*next, {'"', 'c'}, 300);
  int allowed = 0;
  for (int id = 0; id < 300; ++id) allowed += engine::TokenAllowed(mask, id);
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(engine::TokenAllowed(mask, 'd'));
  mask = MaskAfter(*next, {'"', 'c', 'd', '"'}, 300);
  allowed = 0;
  for (int id = 0; id < 300; ++id) allowed += engine::TokenAllowed(mask, id);
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(engine::TokenAllowed(mask, engine::kDemoEndOfTextId));

  // No tokenizer on the worker: refused, not ignored.
  absl::StatusOr<engine::SamplingParams> none = SamplingForWorker(wire, {}, nullptr);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  // A spec the worker cannot compile (an older router, a hand-made job).
  wire.set_grammar(R"({"json_schema": {"type": "string", "format": "date"}})");
  none = SamplingForWorker(wire, {}, compiler.get());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("format"));
}

}  // namespace
}  // namespace pdserve::frontend
