// Tool calls: the request's tools and tool_choice, the format a chat
// template implies, the parser (streamed byte by byte equals whole), and the
// grammar that enforces a call: random draws under its mask always parse
// back into a call of the right function.
#include "frontend/tool_calls.h"

#include <random>

#include "engine/runtime/grammar/grammar_constraint.h"
#include "frontend/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::frontend {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
    "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}])");

TEST(ToolCallsTest, FormatFromFlagOrTemplate) {
  EXPECT_EQ(*ToolCallFormatFor("auto", "{{ '<tool_call>' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(*ToolCallFormatFor("", "<|python_tag|>"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*ToolCallFormatFor("auto", "{{ messages }}"), ToolCallFormat::kNone);
  EXPECT_EQ(*ToolCallFormatFor("llama3_json", "<tool_call>"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*ToolCallFormatFor("none", "<tool_call>"), ToolCallFormat::kNone);
  EXPECT_EQ(ToolCallFormatFor("mistral", "").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ToolCallsTest, ReadsToolsAndChoices) {
  auto t = ReadTools(Json{{"tools", kTools}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tools.size(), 2u);
  EXPECT_EQ(t->choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_TRUE(t->parse());
  t = ReadTools(Json{{"tools", kTools},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}},
                     {"parallel_tool_calls", false}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->choice.mode, ToolChoice::Mode::kNamed);
  EXPECT_EQ(t->choice.name, "get_time");
  EXPECT_FALSE(t->parallel);
  t = ReadTools(Json{{"tools", kTools}, {"tool_choice", "none"}});
  EXPECT_FALSE(t->parse());
  EXPECT_FALSE(ReadTools(Json::object())->parse());

  struct Case {
    Json body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {{{"tools", 1}}, "tools"},
      {{{"tools", {{{"type", "code"}}}}}, "tools[0].type"},
      {{{"tools", {{{"function", {{"name", ""}}}}}}}, "tools[0].function.name"},
      {{{"tools", {{{"function", {{"name", "f"}, {"parameters", 3}}}}}}},
       "tools[0].function.parameters"},
      {{{"tools", kTools}, {"tool_choice", "always"}}, "tool_choice"},
      {{{"tools", kTools}, {"tool_choice", {{"function", {{"name", "nope"}}}}}},
       "tool_choice.function.name"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tools", kTools}, {"parallel_tool_calls", "yes"}}, "parallel_tool_calls"},
  };
  for (const Case& c : cases) {
    auto r = ReadTools(c.body);
    ASSERT_FALSE(r.ok()) << c.body.dump();
    EXPECT_EQ(ErrorField(r.status()), c.field) << r.status();
  }
}

// The pieces of `text` fed in slices of `step` bytes, joined per call.
ParsedToolOutput Streamed(ToolCallFormat format, std::string_view text, size_t step,
                          int* argument_pieces = nullptr) {
  ToolCallParser parser(format);
  std::vector<ToolCallParser::Piece> pieces;
  for (size_t i = 0; i < text.size(); i += step) {
    for (auto& p : parser.Feed(text.substr(i, step))) pieces.push_back(std::move(p));
  }
  for (auto& p : parser.Finish()) pieces.push_back(std::move(p));
  ParsedToolOutput out;
  for (auto& p : pieces) {
    if (p.index < 0) {
      out.content += p.content;
      continue;
    }
    if (static_cast<size_t>(p.index) >= out.calls.size()) {
      EXPECT_FALSE(p.id.empty()) << "a call's first piece carries its id";
      EXPECT_FALSE(p.name.empty());
      out.calls.resize(p.index + 1);
      out.calls[p.index].id = p.id;
      out.calls[p.index].name = p.name;
    }
    if (!p.arguments.empty() && argument_pieces != nullptr) ++*argument_pieces;
    out.calls[p.index].arguments += p.arguments;
  }
  return out;
}

TEST(ToolCallsTest, HermesWholeAndStreamedAgree) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris <3\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\":\"get_time\","
      "\"arguments\":{\"zone\":\"CET\"}}\n</tool_call>";
  const ParsedToolOutput whole = ParseToolOutput(ToolCallFormat::kHermes, text);
  EXPECT_EQ(whole.content, "Let me check.");
  ASSERT_EQ(whole.calls.size(), 2u);
  EXPECT_EQ(whole.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(whole.calls[0].arguments),
            Json::parse(R"({"city": "Paris <3", "unit": "c"})"));
  EXPECT_EQ(whole.calls[1].name, "get_time");
  EXPECT_EQ(whole.calls[1].arguments, R"({"zone":"CET"})");
  EXPECT_THAT(whole.calls[0].id, ::testing::StartsWith("call_"));
  for (size_t step : {1, 2, 3, 7, 64}) {
    int argument_pieces = 0;
    const ParsedToolOutput s = Streamed(ToolCallFormat::kHermes, text, step, &argument_pieces);
    EXPECT_EQ(s.content, whole.content) << step;
    ASSERT_EQ(s.calls.size(), 2u) << step;
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(s.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(s.calls[i].arguments, whole.calls[i].arguments) << step;
    }
    // Arguments stream as they come, not in one piece at the end.
    if (step == 1) EXPECT_GT(argument_pieces, 10);
  }
}

TEST(ToolCallsTest, HermesTextThatIsNoCallStaysContent) {
  for (const std::string text : {std::string("a < b and <tool but no call"),
                                 std::string("x <tool_call>not json</tool_call> y")}) {
    const ParsedToolOutput whole = ParseToolOutput(ToolCallFormat::kHermes, text);
    EXPECT_TRUE(whole.calls.empty()) << text;
    EXPECT_EQ(whole.content, text);
    EXPECT_EQ(Streamed(ToolCallFormat::kHermes, text, 1).content, text);
  }
}

TEST(ToolCallsTest, Llama3Json) {
  const std::string call = R"(<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}})";
  for (size_t step : {1, 5, 100}) {
    const ParsedToolOutput s = Streamed(ToolCallFormat::kLlama3Json, call, step);
    ASSERT_EQ(s.calls.size(), 1u);
    EXPECT_EQ(s.calls[0].name, "get_time");
    EXPECT_EQ(Json::parse(s.calls[0].arguments), Json::parse(R"({"zone": "UTC"})"));
    EXPECT_EQ(s.content, "");
  }
  // Plain text streams through at once.
  ToolCallParser parser(ToolCallFormat::kLlama3Json);
  auto pieces = parser.Feed("Hello");
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].content, "Hello");
  // JSON that is no call is content.
  EXPECT_EQ(ParseToolOutput(ToolCallFormat::kLlama3Json, R"({"a": 1})").content, R"({"a": 1})");
}

TEST(ToolCallsTest, Llama3JsonArgumentsStreamAsTheyAreGenerated) {
  const std::string args =
      R"({"city": "Paris \"le {centre}\"", "days": [1, {"x": "]"}], "unit": "c"})";
  for (const std::string& call :
       {R"(<|python_tag|>{"name": "get_weather", "parameters": )" + args + "}",
        R"(  {"name":"get_weather","arguments":)" + args + " }\n"}) {
    const ParsedToolOutput whole = ParseToolOutput(ToolCallFormat::kLlama3Json, call);
    ASSERT_EQ(whole.calls.size(), 1u) << call;
    EXPECT_EQ(whole.calls[0].name, "get_weather");
    EXPECT_EQ(whole.calls[0].arguments, args);  // as generated, byte for byte
    EXPECT_EQ(whole.content, "");
    for (size_t step : {1, 2, 3, 7, 64}) {
      int argument_pieces = 0;
      const ParsedToolOutput s =
          Streamed(ToolCallFormat::kLlama3Json, call, step, &argument_pieces);
      ASSERT_EQ(s.calls.size(), 1u) << step;
      EXPECT_EQ(s.calls[0].name, "get_weather");
      EXPECT_EQ(s.calls[0].arguments, args) << step;
      EXPECT_EQ(s.content, "") << step;
      if (step == 1) EXPECT_GT(argument_pieces, 10);
    }
  }
  // Token by token: the call's id and name go out once the head is in, the
  // arguments' bytes as they come, before the output ends.
  ToolCallParser parser(ToolCallFormat::kLlama3Json);
  EXPECT_TRUE(parser.Feed(R"({"name": "get_ti)").empty());
  std::vector<ToolCallParser::Piece> head = parser.Feed(R"(me", "parameters": {"zo)");
  ASSERT_EQ(head.size(), 2u);
  EXPECT_EQ(head[0].name, "get_time");
  EXPECT_THAT(head[0].id, ::testing::StartsWith("call_"));
  EXPECT_EQ(head[1].index, 0);
  EXPECT_EQ(head[1].arguments, R"({"zo)");
  std::vector<ToolCallParser::Piece> more = parser.Feed(R"(ne": "UTC"})");
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].arguments, R"(ne": "UTC"})");
  EXPECT_TRUE(parser.Feed("}").empty());  // the call's own closing brace
  EXPECT_TRUE(parser.Finish().empty());
  EXPECT_EQ(parser.calls(), 1);
}

TEST(ToolCallsTest, Llama3JsonOtherLayoutsAndLeftovers) {
  // Name after the arguments: held, parsed whole at the end.
  const ParsedToolOutput late =
      Streamed(ToolCallFormat::kLlama3Json, R"({"parameters": {"a": 1}, "name": "f"})", 1);
  ASSERT_EQ(late.calls.size(), 1u);
  EXPECT_EQ(late.calls[0].name, "f");
  EXPECT_EQ(Json::parse(late.calls[0].arguments), Json::parse(R"({"a": 1})"));
  // Arguments that are no object: no call.
  const std::string text = R"({"name": "f", "parameters": 3})";
  EXPECT_TRUE(Streamed(ToolCallFormat::kLlama3Json, text, 1).calls.empty());
  EXPECT_EQ(Streamed(ToolCallFormat::kLlama3Json, text, 1).content, text);
  // Text after the call object is content; a reply cut short keeps its call.
  const ParsedToolOutput after =
      Streamed(ToolCallFormat::kLlama3Json, R"({"name": "f", "parameters": {}} thanks)", 2);
  ASSERT_EQ(after.calls.size(), 1u);
  EXPECT_EQ(after.calls[0].arguments, "{}");
  EXPECT_EQ(after.content, "thanks");
  const ParsedToolOutput cut =
      Streamed(ToolCallFormat::kLlama3Json, R"({"name": "f", "parameters": {"a": [1,)", 1);
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, R"({"a": [1,)");
}

// A byte vocabulary with a few multi-byte tokens and an EOS.
std::shared_ptr<engine::grammar::GrammarCompiler> ByteCompiler(int* eos) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"<tool_call>", "\n", "{\"", "\": ", "name", "get_", "\"}"})
    bytes.push_back(t);
  *eos = static_cast<int>(bytes.size());
  bytes.push_back("");
  return std::make_shared<engine::grammar::GrammarCompiler>(
      std::make_shared<const engine::grammar::TokenVocabulary>(std::move(bytes),
                                                               std::vector<int>{*eos}));
}

TEST(ToolCallsTest, GrammarMakesEveryOutputACall) {
  int eos = 0;
  auto compiler = ByteCompiler(&eos);
  std::mt19937 rng(3);
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    for (const Json& choice :
         {Json("required"), Json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
      auto tools = ReadTools(Json{{"tools", kTools}, {"tool_choice", choice}});
      ASSERT_TRUE(tools.ok()) << tools.status();
      auto spec = ToolCallGrammarSpec(*tools, format);
      ASSERT_TRUE(spec.ok()) << spec.status();
      for (int trial = 0; trial < 20; ++trial) {
        auto constraint = compiler->Compile(*spec);
        ASSERT_TRUE(constraint.ok()) << constraint.status();
        const int max_tokens = 120;
        std::vector<int32_t> generated;
        std::string text;
        std::vector<uint32_t> mask(engine::TokenMaskWords(compiler->vocab().size()));
        for (int step = 0; step < max_tokens; ++step) {
          (*constraint)->FillMask(generated, max_tokens - step, compiler->vocab().eos_ids(), mask);
          std::vector<int32_t> allowed;
          for (int id = 0; id < compiler->vocab().size(); ++id) {
            if (engine::TokenAllowed(mask, id)) allowed.push_back(id);
          }
          ASSERT_FALSE(allowed.empty());
          const int32_t tok = allowed[rng() % allowed.size()];
          if (tok == eos) break;
          generated.push_back(tok);
          text += compiler->vocab().bytes(tok);
        }
        const ParsedToolOutput parsed = ParseToolOutput(format, text);
        ASSERT_GE(parsed.calls.size(), 1u) << text;
        EXPECT_EQ(parsed.content, "") << text;
        for (const ToolCall& c : parsed.calls) {
          if (choice.is_object()) EXPECT_EQ(c.name, "get_weather") << text;
          const Json args = Json::parse(c.arguments, nullptr, false);
          ASSERT_TRUE(args.is_object()) << text;
          if (c.name == "get_weather") {
            EXPECT_TRUE(args["city"].is_string()) << text;
            EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << text;
          } else {
            EXPECT_EQ(c.name, "get_time") << text;
            EXPECT_TRUE(args["zone"].is_string()) << text;
          }
        }
      }
    }
  }
  auto tools = ReadTools(Json{{"tools", kTools}, {"tool_choice", "required"}});
  auto none = ToolCallGrammarSpec(*tools, ToolCallFormat::kNone);
  EXPECT_EQ(ErrorField(none.status()), "tool_choice");
  EXPECT_THAT(none.status().message(), HasSubstr("--tool_call_parser"));
  tools = ReadTools(Json{{"tools", kTools}});
  EXPECT_EQ(*ToolCallGrammarSpec(*tools, ToolCallFormat::kHermes), "");
}

}  // namespace
}  // namespace pdserve::frontend
