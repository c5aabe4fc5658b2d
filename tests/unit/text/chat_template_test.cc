// Unit tests for chat templates (text/chat_template) and the Jinja subset
// interpreter under them (text/jinja): the Llama 3 and Qwen3 templates as
// shipped in their tokenizer_config.json, with expected prompts written out
// by hand from the templates (and cross-checked with Python's Jinja2 in the
// transformers environment); interpreter semantics (whitespace control,
// scoping, loops, filters, tests, methods); loading from a model directory;
// errors and resource limits.
#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "text/jinja.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve::text {
namespace {

using ::testing::HasSubstr;

// Meta-Llama-3-8B-Instruct's template (tokenizer_config.json "chat_template").
constexpr char kLlama3Template[] =
    R"TPL({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }})TPL";

// Qwen3's template (tokenizer_config.json "chat_template").
constexpr char kQwen3Template[] = R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})TPL";

constexpr char kBos[] = "<|begin_of_text|>";

ChatTemplate Parse(const char* source, std::string bos = "", std::string eos = "") {
  absl::StatusOr<ChatTemplate> t = ParseChatTemplate(source, std::move(bos), std::move(eos));
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

std::string Render(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt, std::optional<bool> enable_thinking = std::nullopt) {
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  if (enable_thinking.has_value()) options.flags.emplace_back("enable_thinking", *enable_thinking);
  absl::StatusOr<std::string> out = RenderChat(t, messages, options);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

// Renders a bare template with an empty context; errors come back as "ERROR: ...".
std::string Jinja(std::string_view source, const jinja::Object& globals = {}) {
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(globals);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

// ------------------------------------------------------------- Llama 3 ----

TEST(ChatTemplateTest, Llama3) {
  const ChatTemplate t = Parse(kLlama3Template, kBos, "<|eot_id|>");
  const std::vector<ChatMessage> chat = {{"system", "You are a helpful assistant."},
                                         {"user", "  What is 2+2?  \n"}};
  const std::string want =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "You are a helpful assistant.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(Render(t, chat, true), want);
  // This template always opens the assistant turn.
  EXPECT_EQ(Render(t, chat, false), want);
  EXPECT_EQ(Render(t, {{"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}}, true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// --------------------------------------------------------------- Qwen3 ----

TEST(ChatTemplateTest, Qwen3SingleTurn) {
  const ChatTemplate t = Parse(kQwen3Template, "", "<|im_end|>");
  EXPECT_EQ(Render(t, {{"user", "Hello!"}}, true),
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Render(t, {{"user", "Hello!"}}, false), "<|im_start|>user\nHello!<|im_end|>\n");
  EXPECT_EQ(Render(t, {{"user", "Hello!"}}, true, /*enable_thinking=*/false),
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(Render(t, {{"user", "Hello!"}}, true, /*enable_thinking=*/true),
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen3SystemAndHistory) {
  const ChatTemplate t = Parse(kQwen3Template, "", "<|im_end|>");
  EXPECT_EQ(
      Render(t,
             {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Joke?"}},
             true),
      "<|im_start|>system\nBe brief.<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello!<|im_end|>\n"
      "<|im_start|>user\nJoke?<|im_end|>\n"
      "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen3DropsOldReasoningAndKeepsTheLast) {
  const ChatTemplate t = Parse(kQwen3Template, "", "<|im_end|>");
  EXPECT_EQ(Render(t,
                   {{"user", "q1"},
                    {"assistant", "<think>\nr1\n</think>\n\na1"},
                    {"user", "q2"},
                    {"assistant", "<think>r2</think>a2"}},
                   false),
            "<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");
}

TEST(ChatTemplateTest, Qwen3ToolResponses) {
  const ChatTemplate t = Parse(kQwen3Template, "", "<|im_end|>");
  // A user turn that is only a tool response does not count as the last query.
  EXPECT_EQ(Render(t,
                   {{"user", "q"},
                    {"assistant", "<think>\nx\n</think>\n\ny"},
                    {"user", "<tool_response>\nr\n</tool_response>"}},
                   true, /*enable_thinking=*/false),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nx\n</think>\n\ny<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Consecutive "tool" messages share one user turn.
  EXPECT_EQ(Render(t, {{"user", "w?"}, {"tool", "sunny"}, {"tool", "windy"}}, true),
            "<|im_start|>user\nw?<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
            "<tool_response>\nwindy\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, EmptyConversationAndRaisedErrors) {
  const ChatTemplate t = Parse(kQwen3Template);
  EXPECT_EQ(RenderChat(t, std::vector<ChatMessage>{}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  const ChatTemplate strict = Parse(
      "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
      "[{{ m.content }}]{% endfor %}");
  const std::vector<ChatMessage> ok = {{"user", "a"}, {"assistant", "b"}};
  const std::vector<ChatMessage> bad = {{"user", "a"}, {"user", "b"}};
  EXPECT_EQ(*RenderChat(strict, ok, true), "[a][b]");
  absl::StatusOr<std::string> r = RenderChat(strict, bad, true);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("roles must alternate"));
}

TEST(ChatTemplateTest, StrftimeNowOnlyWhenGivenATime) {
  const ChatTemplate t = Parse(
      "{% if strftime_now is defined %}{{ strftime_now('%d %b %Y') }}{% else %}26 Jul 2024{% endif "
      "%}");
  const std::vector<ChatMessage> chat = {{"user", "x"}};
  ChatRenderOptions options;
  EXPECT_EQ(*RenderChat(t, chat, options), "26 Jul 2024");
  options.now = absl::FromCivil(absl::CivilSecond(2025, 3, 7, 12, 0, 0), absl::UTCTimeZone());
  EXPECT_EQ(*RenderChat(t, chat, options), "07 Mar 2025");
}

// ----------------------------------------------------- loading from disk ----

class LoadChatTemplateTest : public ::testing::Test {
 protected:
  std::string Dir(const std::string& name) {
    const std::string dir = ::testing::TempDir() + "/chat_template_" + name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
};

TEST_F(LoadChatTemplateTest, FromTokenizerConfig) {
  const std::string dir = Dir("config");
  nlohmann::json config = {
      {"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}},
      {"eos_token", "</s>"},
      {"chat_template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}};
  Write(dir + "/tokenizer_config.json", config.dump());
  absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_token, "<s>");
  EXPECT_EQ(*RenderChat(*t, std::vector<ChatMessage>{{"user", "hi"}}, true), "<s>hi</s>");

  // The list form: the entry named "default".
  config["chat_template"] = nlohmann::json::array({{{"name", "tool_use"}, {"template", "tools"}},
                                                   {{"name", "default"}, {"template", "plain"}}});
  Write(dir + "/tokenizer_config.json", config.dump());
  t = LoadChatTemplate(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*RenderChat(*t, std::vector<ChatMessage>{{"user", "hi"}}, true), "plain");
}

TEST_F(LoadChatTemplateTest, FromJinjaFileOrNotFound) {
  const std::string dir = Dir("jinja");
  Write(dir + "/tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  EXPECT_EQ(LoadChatTemplate(dir).status().code(), absl::StatusCode::kNotFound);
  Write(dir + "/chat_template.jinja",
        "{% for m in messages %}{{ m.role }}{% endfor %}{{ eos_token }}\n");
  absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*RenderChat(*t, std::vector<ChatMessage>{{"user", "hi"}}, true), "user<|im_end|>");
  Write(dir + "/tokenizer_config.json", R"({"chat_template": "{% include 'x' %}"})");
  absl::StatusOr<ChatTemplate> bad = LoadChatTemplate(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unsupported tag"));
  Write(dir + "/tokenizer_config.json", "{not json");
  EXPECT_EQ(LoadChatTemplate(dir).status().code(), absl::StatusCode::kInvalidArgument);
}

// --------------------------------------------------------- interpreter ----

TEST(JinjaTest, WhitespaceControlLikeTransformers) {
  // trim_blocks + lstrip_blocks, "-" and "+" markers, one trailing newline dropped.
  EXPECT_EQ(Jinja("  {% if true %}\n    yes\n  {% endif %}\n  {#- c -#}  \nend\n"), "    yes\nend");
  EXPECT_EQ(
      Jinja("x  {% if 1 %}  y {% endif %}\n\t{% for i in [1,2] %}\n  {{ i }}\n\t{% endfor %}\n"
            "  {# c #}\nz {{- ' w ' -}} q\r\nr\n\n"),
      "x    y   1\n  2\nz w q\nr\n");
  EXPECT_EQ(Jinja("a\n  {%- if true %}\nb {%+ if true %}c{% endif +%}\n d\n{% endif %}"),
            "ab c\n d\n");
}

TEST(JinjaTest, LoopsAndScoping) {
  const jinja::Object ctx = {{"xs", jinja::Value(jinja::Array{1, 2, 3, 4, 5, 7})}};
  EXPECT_EQ(Jinja("{% for x in xs if x is odd %}{{ loop.index }}:{{ x }}{{ ',' if not loop.last }}"
                  "{% else %}none{% endfor %}",
                  ctx),
            "1:1,2:3,3:5,4:7");
  EXPECT_EQ(Jinja("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  // A set inside a loop stays in that iteration; namespaces carry state out.
  EXPECT_EQ(
      Jinja(
          "{% set x = 1 %}{% for i in range(2) %}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}"),
      "11 11 1");
  EXPECT_EQ(
      Jinja("{% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a * 2 + i %}"
            "{% endfor %}{{ ns.a }}"),
      "12");
  EXPECT_EQ(
      Jinja("{% for x in [1,2,3,4] %}{% if x > 2 %}{% break %}{% endif %}{{ x }}{% endfor %}|"
            "{% for x in [1,2,3,4] %}{% if x % 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
      "12|24");
  EXPECT_EQ(Jinja("{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "b=1;a=2;");
  EXPECT_EQ(Jinja("{% for c in 'h\xC3\xA9' %}[{{ c }}]{% endfor %}"), "[h][\xC3\xA9]");
}

TEST(JinjaTest, PythonSemantics) {
  EXPECT_EQ(Jinja("{{ 'abc'[::-1] }} {{ [1,2,3,4][1:3] }} {{ 'h\xC3\xA9llo'[1] }} {{ "
                  "'h\xC3\xA9llo'|length }} "
                  "{{ 'a,b,,c'.split(',') }} {{ '  a b  '.split() }} {{ '--a--'.strip('-') }}"),
            "cba [2, 3] \xC3\xA9 5 ['a', 'b', '', 'c'] ['a', 'b'] a");
  EXPECT_EQ(
      Jinja("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 0.1 + 0.2 }} "
            "{{ 1e20 }} {{ 'a' ~ 1 ~ none }}"),
      "3 -4 2 3.5 1024 0.30000000000000004 1e+20 a1None");
  EXPECT_EQ(
      Jinja("{{ x is string }} {{ x is not none }} {{ y is defined }} {{ 3 is divisibleby 3 }} "
            "{{ {} is mapping }} {{ 1 == 1.0 }} {{ true == 1 }} {{ none }} {{ [1, 'a', none, true] "
            "}}",
            {{"x", jinja::Value("s")}}),
      "True True False True True True True None [1, 'a', None, True]");
  EXPECT_EQ(Jinja("{{ undefined_thing }}|{{ undefined_thing | length }}|{{ nope is defined }}"),
            "|0|False");
}

TEST(JinjaTest, FiltersMacrosAndMethods) {
  const jinja::Object ctx = {
      {"d", jinja::Value(jinja::Object{
                {"b", jinja::Value(jinja::Array{
                          1, 2.5, jinja::Value(jinja::Object{{"c", jinja::Value::None()}})})},
                {"a", jinja::Value("x\ty\xC3\xA9")},
                {"e", jinja::Value(true)}})},
      {"msgs",
       jinja::Value(jinja::Array{jinja::Value(jinja::Object{{"role", jinja::Value("user")},
                                                            {"content", jinja::Value("a")}}),
                                 jinja::Value(jinja::Object{{"role", jinja::Value("assistant")},
                                                            {"content", jinja::Value("b")}}),
                                 jinja::Value(jinja::Object{{"role", jinja::Value("user")},
                                                            {"content", jinja::Value("c")}})})}};
  EXPECT_EQ(Jinja("{{ d | tojson }}|{{ d | tojson(indent=2) }}", ctx),
            "{\"b\": [1, 2.5, {\"c\": null}], \"a\": \"x\\ty\xC3\xA9\", \"e\": true}|"
            "{\n  \"b\": [\n    1,\n    2.5,\n    {\n      \"c\": null\n    }\n  ],\n"
            "  \"a\": \"x\\ty\xC3\xA9\",\n  \"e\": true\n}");
  EXPECT_EQ(Jinja("{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | "
                  "join('|') }} "
                  "{{ msgs | rejectattr('role', 'equalto', 'user') | list | length }}",
                  ctx),
            "a|c 1");
  EXPECT_EQ(Jinja("{%- macro show(m, sep='/') -%}{{ m.role }}{{ sep }}{{ m.content | upper }}{%- "
                  "endmacro -%}"
                  "{% for m in msgs %}{{ show(m) }} {{ show(m, sep='::') }};{% endfor %}",
                  ctx),
            "user/A user::A;assistant/B assistant::B;user/C user::C;");
  EXPECT_EQ(Jinja("{% set s %}block {{ 1 + 2 }}{% endset %}[{{ s }}] {{ 'hello world'.title() }} "
                  "{{ 'ab'.startswith(('x', 'a')) }} {{ 'aaa'.replace('a', 'b', 2) }}"),
            "[block 3] Hello World True bba");
  EXPECT_EQ(Jinja("{{ d.get('zz', 5) }} {{ d.get('e') }} {{ 'b' in d }} {{ d | length }} {{ x | "
                  "default('dflt') }}",
                  ctx),
            "5 True True 3 dflt");
}

TEST(JinjaTest, ErrorsNameTheProblem) {
  EXPECT_THAT(Jinja("{% include 'x.jinja' %}"), HasSubstr("unsupported tag {% include"));
  EXPECT_THAT(Jinja("{{ x | frobnicate }}"), HasSubstr("unsupported filter 'frobnicate'"));
  EXPECT_THAT(Jinja("{% if x %}"), HasSubstr("missing {% endif %}"));
  EXPECT_THAT(Jinja("line one\n{{ 'unclosed }}"), HasSubstr("line 2"));
  EXPECT_THAT(Jinja("{{ a.b.c }}"), HasSubstr("undefined"));
  EXPECT_THAT(Jinja("{{ raise_exception('boom') }}"), HasSubstr("boom"));
  EXPECT_THAT(Jinja("{{ 1 + 'a' }}"), HasSubstr("unsupported operands"));
  EXPECT_THAT(Jinja("{{ 1 / 0 }}"), HasSubstr("division by zero"));
  EXPECT_THAT(Jinja("{{ nofunc() }}"), HasSubstr("undefined function"));
}

TEST(JinjaTest, HostileTemplatesHitLimits) {
  // Runaway loops, output and recursion end with an error, not a hang or crash.
  EXPECT_THAT(
      Jinja("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
      HasSubstr("too long"));
  EXPECT_THAT(Jinja("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}"),
              HasSubstr("output exceeds"));
  EXPECT_THAT(Jinja("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(Jinja("{% if " + std::string(100000, '(') + " %}{% endif %}"),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(Jinja("{% set x = " + std::string(50000, '[') + " %}"),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(Jinja("{% set x = " + std::string(50000, '-') + "1 %}"),
              HasSubstr("nested too deeply"));
  std::string nots = "{% if ";
  for (int i = 0; i < 50000; ++i) nots += "not ";
  EXPECT_THAT(Jinja(nots + "x %}{% endif %}"), HasSubstr("nested too deeply"));
  EXPECT_THAT(Jinja("{{ " + std::string(100000, '(') + " }}"), HasSubstr("unclosed tag"));
  EXPECT_THAT(Jinja("{{ range(10000000) | length }}"), HasSubstr("too long"));
}

}  // namespace
}  // namespace pdserve::text
