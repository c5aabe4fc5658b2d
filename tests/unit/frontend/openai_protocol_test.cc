// The OpenAI-compatible API as data: request bodies in, response objects and
// stream chunks out. The same flows against real processes and the official
// client are in tests/integration/openai_http_test.cc.
#include "frontend/openai_protocol.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "frontend/errors.h"
#include "frontend/request_limits.h"
#include "frontend/request_validation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer_loader.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::frontend::openai {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

const ParseOptions kOptions{.model_name = "demo", .add_bos = true};

absl::StatusOr<ParsedRequest> Completion(const std::string& body) {
  return ParseRequest(Api::kCompletions, body, kOptions);
}
absl::StatusOr<ParsedRequest> Chat(const std::string& body) {
  return ParseRequest(Api::kChat, body, kOptions);
}

TEST(OpenAiParseTest, CompletionFieldsAndDefaults) {
  auto p = Completion(R"({"model": "demo", "prompt": "Hello", "unknown_field": {"x": [1]}})");
  ASSERT_TRUE(p.ok()) << p.status();
  const Request& r = p->request;
  EXPECT_EQ(r.input, Request::Input::kText);
  EXPECT_EQ(r.text, "Hello");
  EXPECT_EQ(r.add_bos, true);
  EXPECT_EQ(r.sampling.max_tokens, 16);     // OpenAI's default
  EXPECT_EQ(r.sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_EQ(r.sampling.logprobs, -1);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_FALSE(p->stream);
  EXPECT_EQ(r.names.text, "prompt");
  EXPECT_EQ(r.names.sampling_prefix, "");

  p = Completion(R"({"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "top_p": 0.5,
                     "top_k": -1, "min_p": 0.1, "seed": 7, "stop": "END",
                     "presence_penalty": 0.5, "frequency_penalty": -0.5,
                     "repetition_penalty": 1.1, "logprobs": 3, "user": "u1", "n": 1,
                     "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->request.input, Request::Input::kTokenIds);
  EXPECT_EQ(p->request.token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(p->request.sampling.max_tokens, 5);
  EXPECT_EQ(p->request.sampling.temperature, 0.0f);
  EXPECT_EQ(p->request.sampling.top_p, 0.5f);
  EXPECT_EQ(p->request.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(p->request.sampling.min_p, 0.1f);
  EXPECT_EQ(p->request.seed, 7u);
  EXPECT_EQ(p->request.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(p->request.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(p->request.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(p->request.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(p->request.sampling.logprobs, 3);
  EXPECT_EQ(p->request.user, "u1");
  EXPECT_TRUE(p->stream);
  EXPECT_TRUE(p->include_usage);

  // One-element batches, and nulls read as absent.
  p = Completion(R"({"prompt": ["x"], "max_tokens": null, "stop": ["a", "b"]})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->request.text, "x");
  EXPECT_EQ(p->request.sampling.max_tokens, 16);
  EXPECT_EQ(p->request.stop, (std::vector<std::string>{"a", "b"}));
  p = Completion(R"({"prompt": [[4, 5]], "max_tokens": 3.0})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->request.token_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(p->request.sampling.max_tokens, 3);
}

TEST(OpenAiParseTest, ChatMessagesToolsAndLogprobs) {
  auto p = Chat(R"({
    "model": "demo",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null,
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}],
    "tool_choice": "auto",
    "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 2,
    "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_TRUE(p.ok()) << p.status();
  const Request& r = p->request;
  EXPECT_EQ(r.input, Request::Input::kChat);
  ASSERT_EQ(r.chat.messages.size(), 4u);
  EXPECT_EQ(r.chat.messages[1].content, "a\nb");
  ASSERT_EQ(r.chat.messages[2].extra.size(), 2u);
  EXPECT_EQ(r.chat.messages[2].extra[0].first, "content");
  EXPECT_TRUE(r.chat.messages[2].extra[0].second.is_none());
  EXPECT_EQ(r.chat.messages[2].extra[1].first, "tool_calls");
  EXPECT_EQ(r.chat.messages[3].extra.size(), 2u);  // name, tool_call_id
  ASSERT_EQ(r.chat.template_variables.size(), 2u);
  EXPECT_EQ(r.chat.template_variables[0].first, "tools");
  // The client's key order reaches the template.
  EXPECT_EQ(*r.chat.template_variables[0].second.ToJson(),
            R"([{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}])");
  EXPECT_EQ(r.chat.template_variables[1].second.as_string(), "auto");
  EXPECT_EQ(r.chat.template_flags,
            (std::vector<std::pair<std::string, bool>>{{"enable_thinking", false}}));
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_EQ(r.names.max_tokens, "max_completion_tokens");
  EXPECT_FALSE(r.max_tokens_to_context);
  EXPECT_EQ(r.sampling.logprobs, 2);

  // Without max_tokens a chat generates up to the end of the context.
  p = Chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->request.max_tokens_to_context);
  p = Chat(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true})");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->request.sampling.logprobs, 0);
}

TEST(OpenAiParseTest, WrongTypesAndUnsupportedFieldsNameTheField) {
  struct Case {
    Api api;
    std::string body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {Api::kCompletions, R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {Api::kCompletions, R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {Api::kCompletions, R"({"prompt": "x", "max_tokens": 99999999999})", "max_tokens"},
      {Api::kCompletions, R"({"prompt": "x", "stream": "yes"})", "stream"},
      {Api::kCompletions, R"({"prompt": "x", "stop": [1]})", "stop[0]"},
      {Api::kCompletions, R"({"prompt": "x", "seed": "7"})", "seed"},
      {Api::kCompletions, R"({"prompt": 5})", "prompt"},
      {Api::kCompletions, R"({"prompt": [1, "a"]})", "prompt[1]"},
      {Api::kCompletions, R"({"prompt": ["a", "b"]})", "prompt"},
      {Api::kCompletions, R"({})", "prompt"},
      {Api::kCompletions, R"({"prompt": "x", "n": 0})", "n"},
      {Api::kCompletions, R"({"prompt": "x", "n": 17})", "n"},
      {Api::kChat, R"({"messages": [], "n": 1.5})", "n"},
      {Api::kCompletions, R"({"prompt": "x", "best_of": 2})", "best_of"},
      {Api::kCompletions, R"({"prompt": "x", "echo": true})", "echo"},
      {Api::kCompletions, R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {Api::kCompletions, R"({"prompt": "x", "logit_bias": {"5": 1}})", "logit_bias"},
      {Api::kCompletions, R"({"prompt": "x", "stream_options": 1})", "stream_options"},
      {Api::kChat, R"({"messages": "hi"})", "messages"},
      {Api::kChat, R"({"messages": [{"content": "hi"}]})", "messages[0].role"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": 3}]})", "messages[0].content"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type"},
      {Api::kChat, R"({"messages": [], "tools": {}})", "tools"},
      {Api::kChat, R"({"messages": [], "top_logprobs": 2})", "top_logprobs"},
      {Api::kChat, R"({"messages": [], "chat_template_kwargs": {"x": 1}})",
       "chat_template_kwargs.x"},
      {Api::kChat, R"({"messages": [], "response_format": {"type": "yaml"}})",
       "response_format.type"},
  };
  for (const Case& c : cases) {
    auto p = ParseRequest(c.api, c.body, kOptions);
    ASSERT_FALSE(p.ok()) << c.body;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(ErrorField(p.status()), c.field) << c.body << ": " << p.status();
    EXPECT_THAT(p.status().message(), HasSubstr(c.field)) << c.body;
  }
}

// A list of `n` copies of `item`.
Json ListOf(int n, const Json& item) {
  return Json(std::vector<Json>(static_cast<size_t>(n), item));
}

TEST(OpenAiParseTest, SeveralChoicesUpToTheCap) {
  auto one = Completion(R"({"prompt": "x"})");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->n, 1);
  auto three = Chat(R"({"messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": 9})");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->n, 3);
  EXPECT_EQ(three->request.seed, 9u);
  ParseOptions capped = kOptions;
  capped.max_n = 4;
  EXPECT_TRUE(ParseRequest(Api::kCompletions, R"({"prompt": "x", "n": 4})", capped).ok());
  auto over = ParseRequest(Api::kCompletions, R"({"prompt": "x", "n": 5})", capped);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(ErrorField(over.status()), "n");
  EXPECT_THAT(over.status().message(), HasSubstr("at most 4 choices"));
  // best_of stays refused, whatever n is.
  auto best_of = Completion(R"({"prompt": "x", "n": 2, "best_of": 2})");
  ASSERT_FALSE(best_of.ok());
  EXPECT_EQ(ErrorField(best_of.status()), "best_of");
}

TEST(OpenAiParseTest, ListsOverTheirLimitsAreRefusedNamingTheField) {
  const Json user = {{"role", "user"}, {"content", "x"}};
  const Json tool = {{"type", "function"}, {"function", {{"name", "f"}}}};
  Json kwargs = Json::object();
  for (int i = 0; i <= kMaxChatTemplateKwargs; ++i) kwargs[absl::StrCat("k", i)] = true;
  struct Case {
    Api api;
    Json body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {Api::kCompletions,
       {{"prompt", "x"}, {"stop_token_ids", ListOf(kMaxStopTokenIds + 1, 1)}},
       "stop_token_ids"},
      {Api::kCompletions, {{"prompt", "x"}, {"stop", ListOf(kMaxStopStrings + 1, "s")}}, "stop"},
      {Api::kChat, {{"messages", ListOf(kMaxChatMessages + 1, user)}}, "messages"},
      {Api::kChat, {{"messages", {user}}, {"tools", ListOf(kMaxTools + 1, tool)}}, "tools"},
      {Api::kChat,
       {{"messages", {user}}, {"chat_template_kwargs", kwargs}},
       "chat_template_kwargs"},
      {Api::kChat,
       {{"messages",
         {{{"role", "user"},
           {"content", ListOf(kMaxContentParts + 1, {{"type", "text"}, {"text", "a"}})}}}}},
       "messages[0].content"},
      {Api::kChat,
       {{"messages",
         {{{"role", "assistant"}, {"tool_calls", ListOf(kMaxToolCallsPerMessage + 1, tool)}}}}},
       "messages[0].tool_calls"},
  };
  for (const Case& c : cases) {
    auto p = ParseRequest(c.api, c.body.dump(), kOptions);
    ASSERT_FALSE(p.ok()) << c.field;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(ErrorField(p.status()), c.field) << p.status();
    EXPECT_THAT(p.status().message(), HasSubstr("at most")) << p.status();
  }
  // At the limits they are taken.
  auto ok = Completion(Json({{"prompt", "x"},
                             {"stop_token_ids", ListOf(kMaxStopTokenIds, 1)},
                             {"stop", ListOf(kMaxStopStrings, "s")}})
                           .dump());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->request.sampling.stop_token_ids.size(), static_cast<size_t>(kMaxStopTokenIds));
  EXPECT_TRUE(
      Chat(Json({{"messages", ListOf(kMaxChatMessages, user)}, {"tools", ListOf(kMaxTools, tool)}})
               .dump())
          .ok());
}

TEST(OpenAiParseTest, BodiesThatAreNotJsonAndOtherModels) {
  auto p = Completion("{\"prompt\": ");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("not valid JSON"));
  EXPECT_EQ(Completion("[1]").status().code(), absl::StatusCode::kInvalidArgument);

  p = Completion(R"({"model": "gpt-4", "prompt": "x"})");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrorField(p.status()), "model");
  EXPECT_THAT(p.status().message(), HasSubstr("gpt-4"));
}

TEST(OpenAiParseTest, InvalidUtf8IsNamedByField) {
  auto p = Chat(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"ok\"},"
      " {\"role\": \"user\", \"content\": \"bad \xC3\x28 here\"}]}");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(), "messages[1].content is not valid UTF-8");
  EXPECT_EQ(ErrorField(p.status()), "messages[1].content");

  p = Completion("{\"prompt\": \"x\", \"stop\": [\"a\", \"\xFF\"]}");
  EXPECT_EQ(p.status().message(), "stop[1] is not valid UTF-8");
  p = Completion("{\"prompt\": \"\xED\xA0\x80\"}");  // a UTF-16 surrogate in UTF-8
  EXPECT_EQ(p.status().message(), "prompt is not valid UTF-8");
  // A lone surrogate escape is no valid JSON string either.
  EXPECT_EQ(Completion(R"({"prompt": "\ud800"})").status().code(),
            absl::StatusCode::kInvalidArgument);
  // U+FFFD itself is fine.
  EXPECT_TRUE(Completion("{\"prompt\": \"\xEF\xBF\xBD\"}").ok());
}

TEST(OpenAiParseTest, ToolsReachTheChatTemplate) {
  const std::string dir = ::testing::TempDir() + "/openai_tools_template";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(engine::WriteDemoTokenizer(300, dir).ok());
  PromptSource source;
  source.config.vocab_size = 300;
  source.config.max_position_embeddings = 256;
  auto tokenizer = text::LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok());
  source.tokenizer = *std::move(tokenizer);
  auto tmpl = text::ParseChatTemplate(
      "{% if tools %}[{{ tools[0].function.name }}|{{ tool_choice }}]{% endif %}"
      "{% for m in messages %}{{ m.role }}:{% if m.content is none %}-{% else %}{{ m.content }}"
      "{% endif %}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}{% endif %}"
      "{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %};{% endfor %}",
      "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  source.chat_template = *std::move(tmpl);
  auto p = Chat(R"({"messages": [
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "lookup"}}], "tool_choice": "auto",
    "max_tokens": 4})");
  ASSERT_TRUE(p.ok()) << p.status();
  auto v = ValidateRequest(p->request, source, {}, absl::Now(), 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(source.tokenizer->Decode(v->prompt), "[lookup|auto]user:q;assistant:-f;tool:42#c1;");

  // Validation names fields the OpenAI way.
  p = Chat(R"({"messages": [{"role": "narrator", "content": "x"}], "max_tokens": 4})");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(ErrorField(ValidateRequest(p->request, source, {}, absl::Now(), 1).status()),
            "messages[0].role");
  p = Chat(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(ErrorField(ValidateRequest(p->request, source, {}, absl::Now(), 1).status()),
            "max_completion_tokens");
  p = Chat(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 300})");
  ASSERT_TRUE(p.ok());
  auto bad = ValidateRequest(p->request, source, {}, absl::Now(), 1);
  EXPECT_EQ(ErrorField(bad.status()), "temperature");
  EXPECT_THAT(std::string(bad.status().message()), ::testing::StartsWith("temperature must be in"));
  // Up to the end of the context when max_tokens is not given.
  p = Chat(R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(p.ok());
  v = ValidateRequest(p->request, source, {}, absl::Now(), 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->sampling.max_tokens + static_cast<int>(v->prompt.size()), 256);
}

TEST(OpenAiErrorTest, StatusesAndBody) {
  EXPECT_EQ(HttpStatus(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kInternal), 500);
  const Json body = Json::parse(ErrorBody(FieldError("temperature", " must be a number")));
  EXPECT_EQ(body["error"]["message"], "temperature must be a number");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "temperature");
  EXPECT_TRUE(body["error"]["code"].is_null());
  const Json busy = Json::parse(ErrorBody(absl::ResourceExhaustedError("full")));
  EXPECT_EQ(busy["error"]["code"], "rate_limit_exceeded");
  EXPECT_TRUE(busy["error"]["param"].is_null());
}

Delta TokenDelta(std::vector<int32_t> ids, std::string text, bool logprobs) {
  Delta d;
  d.token_ids = std::move(ids);
  d.text = std::move(text);
  if (logprobs) {
    for (int32_t id : d.token_ids) {
      d.logprobs.push_back({.token = id, .logprob = -0.5f, .top = {{id, -0.5f}, {'z', -1.0f}}});
    }
  }
  return d;
}

Delta LastDelta(engine::FinishReason reason, int prompt_tokens, int completion_tokens) {
  Delta d;
  d.finished = true;
  d.finish_reason = reason;
  d.prompt_tokens = prompt_tokens;
  d.completion_tokens = completion_tokens;
  return d;
}

TEST(OpenAiFormatTest, ChatStreamOpensWithTheRoleAndEndsWithUsage) {
  text::ByteTokenizer tokenizer(300);
  ResponseFormatter f(Api::kChat, "chatcmpl-1", 1700000000, "demo", tokenizer,
                      /*include_usage=*/true, /*logprobs=*/true);
  std::vector<std::string> chunks = f.Chunks(TokenDelta({'h', 'i'}, "hi", true));
  ASSERT_EQ(chunks.size(), 2u);
  Json role = Json::parse(chunks[0]);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["id"], "chatcmpl-1");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["usage"].is_null());
  Json content = Json::parse(chunks[1]);
  EXPECT_EQ(content["choices"][0]["delta"]["content"], "hi");
  EXPECT_TRUE(content["choices"][0]["finish_reason"].is_null());
  const Json& lp = content["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 2u);
  EXPECT_EQ(lp[0]["token"], "h");
  EXPECT_EQ(lp[0]["bytes"], Json::array({'h'}));
  EXPECT_EQ(lp[0]["logprob"], -0.5);
  EXPECT_EQ(lp[1]["top_logprobs"][1]["token"], "z");

  chunks = f.Chunks(LastDelta(engine::FinishReason::kContext, 3, 2));
  ASSERT_EQ(chunks.size(), 2u);
  Json last = Json::parse(chunks[0]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["choices"][0]["delta"], Json::object());
  Json usage = Json::parse(chunks[1]);
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
}

TEST(OpenAiFormatTest, CompletionStreamAndWholeResponse) {
  text::ByteTokenizer tokenizer(300);
  ResponseFormatter stream(Api::kCompletions, "cmpl-1", 1, "demo", tokenizer, false, false);
  std::vector<std::string> chunks = stream.Chunks(TokenDelta({0xC3}, "", false));
  EXPECT_TRUE(chunks.empty());  // nothing to say yet
  chunks = stream.Chunks(TokenDelta({0xA9}, "é", false));
  ASSERT_EQ(chunks.size(), 1u);
  Json c = Json::parse(chunks[0]);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "é");
  EXPECT_FALSE(c.contains("usage"));
  chunks = stream.Chunks(LastDelta(engine::FinishReason::kStop, 1, 2));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(Json::parse(chunks[0])["choices"][0]["finish_reason"], "stop");

  ResponseFormatter whole(Api::kCompletions, "cmpl-2", 1, "demo", tokenizer, false, true);
  whole.Add(TokenDelta({'a', 'b'}, "ab", true));
  whole.Add(TokenDelta({'c'}, "c", true));
  whole.Add(LastDelta(engine::FinishReason::kLength, 4, 3));
  Json body = Json::parse(whole.Body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "abc");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
  const Json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json::array({"a", "b", "c"}));
  EXPECT_EQ(lp["token_logprobs"], Json::array({-0.5, -0.5, -0.5}));
  EXPECT_EQ(lp["text_offset"], Json::array({0, 1, 2}));
  EXPECT_EQ(lp["top_logprobs"][0]["z"], -1.0);

  ResponseFormatter chat(Api::kChat, "chatcmpl-2", 1, "demo", tokenizer, false, false);
  chat.Add(TokenDelta({'o', 'k'}, "ok", false));
  chat.Add(LastDelta(engine::FinishReason::kStop, 2, 2));
  body = Json::parse(chat.Body());
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "ok");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiFormatTest, SeveralChoicesCarryTheirIndexAndShareOneUsage) {
  text::ByteTokenizer tokenizer(300);
  std::vector<std::unique_ptr<ResponseFormatter>> stream, whole;
  for (int i = 0; i < 2; ++i) {
    stream.push_back(std::make_unique<ResponseFormatter>(Api::kChat, "chatcmpl-3", 1, "demo",
                                                         tokenizer, /*include_usage=*/true, false,
                                                         ToolCallFormat::kNone, i));
    whole.push_back(std::make_unique<ResponseFormatter>(
        Api::kCompletions, "cmpl-3", 1, "demo", tokenizer, false, false, ToolCallFormat::kNone, i));
  }
  // Streamed: each choice opens with its role, every chunk names its index,
  // and no choice ends the stream with a usage chunk of its own.
  std::vector<std::string> chunks = stream[1]->Chunks(TokenDelta({'b'}, "b", false));
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(Json::parse(chunks[0])["choices"][0]["index"], 1);
  EXPECT_EQ(Json::parse(chunks[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(Json::parse(chunks[1])["choices"][0]["index"], 1);
  EXPECT_EQ(Json::parse(chunks[1])["choices"][0]["delta"]["content"], "b");
  EXPECT_TRUE(Json::parse(chunks[1])["usage"].is_null());
  chunks = stream[0]->Chunks(TokenDelta({'a'}, "a", false));
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(Json::parse(chunks[1])["choices"][0]["index"], 0);
  chunks = stream[1]->Chunks(LastDelta(engine::FinishReason::kLength, 4, 1));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(Json::parse(chunks[0])["choices"][0]["finish_reason"], "length");
  const Json usage = Json::parse(stream[0]->UsageChunk(4, 3));
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);

  // Whole: one choice each, in order; the prompt counted once.
  whole[0]->Add(TokenDelta({'x', 'y'}, "xy", false));
  whole[0]->Add(LastDelta(engine::FinishReason::kLength, 4, 2));
  whole[1]->Add(TokenDelta({'z'}, "z", false));
  whole[1]->Add(LastDelta(engine::FinishReason::kStop, 4, 1));
  const std::vector<const ResponseFormatter*> all = {whole[0].get(), whole[1].get()};
  const Json body = Json::parse(ResponseFormatter::Body(all));
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["text"], "xy");
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["text"], "z");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
}

TEST(OpenAiFormatTest, ModelsListAndIds) {
  const Json models = Json::parse(ModelsBody("demo", 512, 5));
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "demo");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  EXPECT_THAT(NewResponseId(Api::kChat), ::testing::StartsWith("chatcmpl-"));
  EXPECT_NE(NewResponseId(Api::kCompletions), NewResponseId(Api::kCompletions));
}

}  // namespace
}  // namespace pdserve::frontend::openai
