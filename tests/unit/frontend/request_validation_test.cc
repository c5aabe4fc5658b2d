#include "frontend/request_validation.h"

#include <filesystem>
#include <fstream>

#include "frontend/errors.h"
#include "frontend/generate_request_proto.h"
#include "frontend/openai_protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/tokenizer_loader.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::frontend {
namespace {

using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

engine::ModelConfig Config() {
  engine::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 300;
  c.max_position_embeddings = 64;
  c.bos_token_id = 256;
  c.eos_token_ids = {257};
  return c;
}

// A byte-level model without tokenizer files or chat template.
PromptSource ByteSource() {
  PromptSource source;
  source.config = Config();
  source.tokenizer = std::make_unique<text::ByteTokenizer>(300);
  return source;
}

// The self-made Llama 3 style tokenizer and chat template
// (tools/tokenizer_writer.h), loaded from disk as a real model's are.
PromptSource ChatSource() {
  const std::string dir = ::testing::TempDir() + "/request_validation_chat";
  std::filesystem::create_directories(dir);
  EXPECT_TRUE(engine::WriteDemoTokenizer(300, dir).ok());
  PromptSource source;
  source.config = Config();
  auto tokenizer = text::LoadTokenizer(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  source.tokenizer = *std::move(tokenizer);
  auto chat_template = text::LoadChatTemplate(dir);
  EXPECT_TRUE(chat_template.ok()) << chat_template.status();
  source.chat_template = *std::move(chat_template);
  return source;
}

// A gRPC request through the gRPC adapter's conversion and validation.
absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& request,
                                                 const PromptSource& source, absl::Time now,
                                                 uint64_t default_seed,
                                                 ValidationOptions options = {}) {
  absl::StatusOr<Request> native = RequestFromProto(request);
  if (!native.ok()) return native.status();
  return frontend::ValidateRequest(*native, source, options, now, default_seed);
}

v1::GenerateRequest Chat(std::vector<std::pair<std::string, std::string>> messages,
                         int max_tokens) {
  v1::GenerateRequest r;
  r.mutable_chat();
  for (const auto& [role, content] : messages) {
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

v1::GenerateRequest Text(const std::string& text, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

TEST(RequestValidationTest, TokenizesTextAndResolvesDefaults) {
  const PromptSource source = ByteSource();
  v1::GenerateRequest r = Text("hi", 5);
  r.set_add_bos(true);
  auto v = ValidateRequest(r, source, kNow, 77);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->prompt, (std::vector<int32_t>{256, 'h', 'i'}));
  EXPECT_EQ(v->sampling.seed, 77u);
  EXPECT_EQ(v->sampling.top_p, 1.0f);  // unset reads as off
  EXPECT_EQ(v->sampling.max_tokens, 5);
  r.mutable_sampling()->set_seed(5);
  EXPECT_EQ(ValidateRequest(r, source, kNow, 77)->sampling.seed, 5u);
}

TEST(RequestValidationTest, RejectsBadInputNamingTheField) {
  const PromptSource source = ByteSource();
  struct Case {
    v1::GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({v1::GenerateRequest(), "input"});
  cases.push_back({Text("", 4), "text"});
  cases.push_back({Text(std::string(64, 'a'), 4), "input"});
  cases.push_back({Text("a", 0), "max_tokens"});
  cases.push_back({Chat({{"user", "hi"}}, 4), "chat: the model has no chat template"});
  cases.push_back({Text(std::string(60, 'a'), 5), "max_tokens"});
  {
    v1::GenerateRequest r;
    r.mutable_token_ids()->add_ids(300);
    r.mutable_sampling()->set_max_tokens(1);
    cases.push_back({r, "token_ids"});
  }
  {
    v1::GenerateRequest r = Text("a", 4);
    r.mutable_sampling()->set_temperature(101);
    cases.push_back({r, "temperature"});
  }
  {
    v1::GenerateRequest r = Text("a", 4);
    r.mutable_sampling()->set_top_k(301);
    cases.push_back({r, "top_k"});
  }
  {
    v1::GenerateRequest r = Text("a", 4);
    r.mutable_sampling()->set_top_p(-0.5f);
    cases.push_back({r, "top_p"});
  }
  {
    v1::GenerateRequest r = Text("a", 4);
    for (int i = 0; i <= engine::kMaxStopTokenIds; ++i) r.mutable_sampling()->add_stop_token_ids(1);
    cases.push_back({r, "sampling.stop_token_ids must hold at most 1024 ids"});
  }
  for (const Case& c : cases) {
    auto v = ValidateRequest(c.request, source, kNow, 1);
    ASSERT_FALSE(v.ok()) << c.field;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find(c.field), absl::string_view::npos) << v.status();
  }
}

TEST(RequestValidationTest, TextTakesBosFromTheTokenizer) {
  PromptSource source = ChatSource();
  source.config.bos_token_id = 5;  // config.json may disagree: the tokenizer files win
  v1::GenerateRequest r = Text("the cache", 4);
  r.set_add_bos(true);
  auto v = ValidateRequest(r, source, kNow, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_FALSE(v->prompt.empty());
  EXPECT_EQ(v->prompt[0], engine::kDemoBosId);
  EXPECT_EQ(source.tokenizer->Decode(v->prompt), "the cache");
  // Merges learned by the writer apply: fewer tokens than bytes.
  EXPECT_LT(v->prompt.size(), 1 + std::string("the cache").size());
}

// Without add_bos, a text prompt gets a BOS exactly where the tokenizer's
// own settings add one (Hugging Face's encode), as the OpenAI API does: the
// same prompt tokens over both APIs. add_bos overrides either way.
TEST(RequestValidationTest, BosFollowsTheTokenizerUnlessTheRequestSays) {
  // tokenizer_config.json says add_bos_token: true.
  PromptSource with_bos = ChatSource();
  ASSERT_TRUE(with_bos.tokenizer->add_bos_token());
  v1::GenerateRequest r = Text("hi", 4);
  auto v = ValidateRequest(r, with_bos, kNow, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->prompt.front(), engine::kDemoBosId);
  r.set_add_bos(false);
  v = ValidateRequest(r, with_bos, kNow, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_NE(v->prompt.front(), engine::kDemoBosId);

  // A tokenizer that adds nothing (as Qwen's): config.json's bos_token_id is
  // not inserted by default, only on an explicit add_bos.
  const PromptSource without = ByteSource();
  ASSERT_FALSE(without.tokenizer->add_bos_token());
  r.clear_add_bos();
  v = ValidateRequest(r, without, kNow, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->prompt, (std::vector<int32_t>{'h', 'i'}));
  r.set_add_bos(true);
  v = ValidateRequest(r, without, kNow, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->prompt, (std::vector<int32_t>{256, 'h', 'i'}));

  // The OpenAI adapter resolves to the same prompt as gRPC without add_bos.
  for (const PromptSource* source : {static_cast<const PromptSource*>(&with_bos), &without}) {
    auto parsed = openai::ParseRequest(
        openai::Api::kCompletions, R"({"prompt": "hi"})",
        {.model_name = "m", .add_bos = source->tokenizer->add_bos_token()});
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto http = frontend::ValidateRequest(parsed->request, *source, {}, kNow, 1);
    r.clear_add_bos();
    auto grpc = ValidateRequest(r, *source, kNow, 1);
    ASSERT_TRUE(http.ok() && grpc.ok());
    EXPECT_EQ(http->prompt, grpc->prompt);
  }
}

TEST(RequestValidationTest, RendersChatThroughTheModelTemplate) {
  const PromptSource source = ChatSource();
  auto v = ValidateRequest(Chat({{"system", "Be brief."}, {"user", "  Hello there \n"}}, 8), source,
                           kNow, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  // Llama 3 Instruct layout: BOS from the template, contents trimmed, each
  // turn closed by <|eot_id|>, then the opening of the assistant turn.
  const std::string expected =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(v->prompt, source.tokenizer->Encode(expected));
  EXPECT_EQ(source.tokenizer->Decode(v->prompt, /*skip_special_tokens=*/false), expected);
  EXPECT_EQ(v->prompt[0], engine::kDemoBosId);  // once: no BOS added on top
  EXPECT_EQ(std::count(v->prompt.begin(), v->prompt.end(), engine::kDemoBosId), 1);
  EXPECT_EQ(std::count(v->prompt.begin(), v->prompt.end(), engine::kDemoEotId), 2);
}

TEST(RequestValidationTest, RejectsBadChatNamingTheField) {
  const PromptSource source = ChatSource();
  struct Case {
    v1::GenerateRequest request;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Chat({}, 4), "chat.messages is empty"},
      {Chat({{"user", "hi"}, {"robot", "x"}}, 4), "chat.messages[1].role"},
      {Chat({{"user", std::string(80, 'a')}}, 4), "input: the prompt has"},
  };
  for (const Case& c : cases) {
    auto v = ValidateRequest(c.request, source, kNow, 1);
    ASSERT_FALSE(v.ok()) << c.message;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(v.status().message(), HasSubstr(c.message));
  }
}

TEST(RequestValidationTest, ReportsTheTemplatesOwnError) {
  PromptSource source = ChatSource();
  auto strict = text::ParseChatTemplate(
      "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with the "
      "user') }}{% endif %}{{ messages[0].content }}",
      "", "");
  ASSERT_TRUE(strict.ok()) << strict.status();
  source.chat_template = *std::move(strict);
  auto v = ValidateRequest(Chat({{"assistant", "hi"}}, 4), source, kNow, 1);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("chat: "));
  EXPECT_THAT(v.status().message(), HasSubstr("Conversations must start with the user"));
  EXPECT_TRUE(ValidateRequest(Chat({{"user", "hi"}}, 4), source, kNow, 1).ok());
}

TEST(RequestValidationTest, ChatTemplateKwargsReachTheTemplate) {
  PromptSource source = ChatSource();
  // As Qwen3's template: thinking is on unless the caller turns it off.
  auto qwen_like = text::ParseChatTemplate(
      "{{ messages[0].content }}{% if enable_thinking is defined and enable_thinking is false "
      "%}<think></think>{% endif %}",
      "", "");
  ASSERT_TRUE(qwen_like.ok()) << qwen_like.status();
  source.chat_template = *std::move(qwen_like);
  v1::GenerateRequest r = Chat({{"user", "hi"}}, 4);
  auto plain = ValidateRequest(r, source, kNow, 1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(source.tokenizer->Decode(plain->prompt), "hi");
  (*r.mutable_chat()->mutable_chat_template_kwargs())["enable_thinking"] = false;
  auto no_think = ValidateRequest(r, source, kNow, 1);
  ASSERT_TRUE(no_think.ok()) << no_think.status();
  EXPECT_EQ(source.tokenizer->Decode(no_think->prompt), "hi<think></think>");

  for (const std::string bad : {"add_generation_prompt", "messages", "9lives", "a-b", ""}) {
    v1::GenerateRequest b = Chat({{"user", "hi"}}, 4);
    (*b.mutable_chat()->mutable_chat_template_kwargs())[bad] = true;
    auto v = ValidateRequest(b, source, kNow, 1);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_THAT(v.status().message(), HasSubstr("chat.chat_template_kwargs")) << bad;
  }
}

TEST(RequestValidationTest, RefusesChatWithTheReasonTheTemplateIsUnusable) {
  PromptSource source = ByteSource();
  source.chat_unavailable = "the model's chat template is not usable: line 3: unknown tag";
  auto v = ValidateRequest(Chat({{"user", "hi"}}, 4), source, kNow, 1);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr("line 3: unknown tag"));
}

// A model whose tokenizer files cannot be loaded: PromptSource::Load serves
// token ids and refuses what needs text.
TEST(RequestValidationTest, WithoutATokenizerOnlyTokenIdsAreServed) {
  const std::string dir = ::testing::TempDir() + "/request_validation_no_tokenizer";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  engine::ModelConfig config = Config();
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_layers = 1;
  config.num_heads = 4;
  config.num_kv_heads = 4;
  config.head_dim = 16;
  std::ofstream(dir + "/config.json") << config.ToJson();
  std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "WordPiece", "vocab": {}}})";
  absl::StatusOr<PromptSource> source = PromptSource::Load(dir);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_THAT(source->text_unavailable, HasSubstr("WordPiece"));
  ASSERT_NE(source->tokenizer, nullptr);
  EXPECT_EQ(source->tokenizer->Decode(std::vector<int32_t>{1, 2, 3}), "");

  v1::GenerateRequest ids;
  for (int t : {1, 2, 3}) ids.mutable_token_ids()->add_ids(t);
  ids.mutable_sampling()->set_max_tokens(4);
  auto v = ValidateRequest(ids, *source, kNow, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->prompt, (std::vector<int32_t>{1, 2, 3}));

  for (const v1::GenerateRequest& r : {Text("hi", 4), Chat({{"user", "hi"}}, 4)}) {
    v = ValidateRequest(r, *source, kNow, 1);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(v.status().message(), HasSubstr("tokenizer cannot be loaded"));
  }
  ids.mutable_sampling()->add_stop("x");
  v = ValidateRequest(ids, *source, kNow, 1);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr("sampling.stop"));

  // A tokenizer that loads leaves text on.
  std::filesystem::remove(dir + "/tokenizer.json");
  source = PromptSource::Load(dir);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(source->text_unavailable.empty());
  EXPECT_TRUE(ValidateRequest(Text("hi", 4), *source, kNow, 1).ok());
}

}  // namespace
}  // namespace pdserve::frontend
