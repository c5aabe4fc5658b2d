// Structured output: JSON Schema -> grammar, the parse states, the token
// masks (against a brute-force check of every token) and generation under
// the mask from random logits.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/grammar/grammar_constraint.h"
#include "engine/runtime/grammar/grammar_matcher.h"
#include "engine/runtime/grammar/grammar_spec.h"
#include "engine/types/token_constraint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve::engine::grammar {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

// Ids 0..255 are the bytes; then multi-byte tokens a byte-level BPE would
// have (JSON punctuation runs, words, quotes with text); then EOS.
std::shared_ptr<const TokenVocabulary> TestVocab(int* eos_out = nullptr) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t :
       {"{\"", "\":", "\": ",     "\",",      "\", \"", "\"}",    "\"]",   "},",    "}}",
        "]}",  "[{",  "[{\"",     "name",     "age",    "true",   "false", "null",  "12",
        "3.5", "e+",  "\\n",      "\\u00",    "hello",  " world", "\"a",   "\"b\"", ", ",
        "{}",  "[]",  "\xC3\xA9", "\xE2\x82", "\xAC",   "},{\"",  "\"\"",  "-1",    "00"}) {
    bytes.push_back(t);
  }
  const int eos = static_cast<int>(bytes.size());
  bytes.push_back("");  // EOS: no text
  bytes.push_back("");  // another special token
  if (eos_out != nullptr) *eos_out = eos;
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int>{eos});
}

std::shared_ptr<const CompiledGrammar> Compile(const Json& spec,
                                               std::shared_ptr<const TokenVocabulary> vocab) {
  absl::StatusOr<Grammar> g = CompileGrammarSpec(spec.dump());
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  return std::make_shared<const CompiledGrammar>(*std::move(g), std::move(vocab));
}

// Whether the whole text is an output of the grammar.
bool Accepts(const Grammar& g, const std::string& text) {
  StackArena arena(g);
  StepOut state = StartState(g, arena), scratch;
  if (text.empty()) return false;
  return AdvanceBytes(g, arena, text, state, scratch) && state.bottom_reached;
}

bool AcceptsSchema(const Json& schema, const std::string& text, bool strict = false) {
  absl::StatusOr<Grammar> g = CompileGrammarSpec(JsonSchemaSpec(schema, strict).dump());
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() && Accepts(*g, text);
}

absl::Status SchemaStatus(const Json& schema) {
  return CompileGrammarSpec(JsonSchemaSpec(schema, false).dump()).status();
}

TEST(GrammarTest, Literals) {
  absl::StatusOr<Grammar> g = CompileGrammarSpec(R"({"literal": "abc"})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "abc"));
  EXPECT_FALSE(Accepts(*g, "ab"));
  EXPECT_FALSE(Accepts(*g, "abcd"));
  EXPECT_EQ(g->MinLength(), 3);
}

TEST(GrammarTest, StringsNumbersAndEscapes) {
  const Json str = {{"type", "string"}};
  EXPECT_TRUE(AcceptsSchema(str, R"("")"));
  EXPECT_TRUE(AcceptsSchema(str, R"("a\"b\\c\n\u00e9\/")"));
  EXPECT_TRUE(AcceptsSchema(str, "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\xAA\xBF\""));
  EXPECT_FALSE(AcceptsSchema(str, "\"a\nb\""));          // raw control character
  EXPECT_FALSE(AcceptsSchema(str, R"("\x")"));           // unknown escape
  EXPECT_FALSE(AcceptsSchema(str, R"("\u12")"));         // short \u
  EXPECT_FALSE(AcceptsSchema(str, "\"\xC3\""));          // truncated UTF-8
  EXPECT_FALSE(AcceptsSchema(str, "\"\xED\xA0\x80\""));  // encoded surrogate
  const Json num = {{"type", "number"}};
  for (const char* ok : {"0", "-0", "12", "-3.25", "1e5", "2.5E-07", "9999999999999999"}) {
    EXPECT_TRUE(AcceptsSchema(num, ok)) << ok;
  }
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "1e123", "99999999999999999", "-"}) {
    EXPECT_FALSE(AcceptsSchema(num, bad)) << bad;
  }
  const Json integer = {{"type", "integer"}};
  EXPECT_TRUE(AcceptsSchema(integer, "-42"));
  EXPECT_FALSE(AcceptsSchema(integer, "4.2"));
  EXPECT_TRUE(AcceptsSchema({{"type", "boolean"}}, "false"));
  EXPECT_TRUE(AcceptsSchema({{"type", {"null", "integer"}}}, "null"));
}

TEST(GrammarTest, ObjectsWithRequiredAndOptionalProperties) {
  const Json schema = Json::parse(R"({
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
    "required": ["b"], "additionalProperties": false})");
  EXPECT_TRUE(AcceptsSchema(schema, R"({"b":"x"})"));
  EXPECT_TRUE(AcceptsSchema(schema, R"({"a":1,"b":"x"})"));
  EXPECT_TRUE(AcceptsSchema(schema, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(AcceptsSchema(schema, R"({"b":"x","c":false})"));
  EXPECT_FALSE(AcceptsSchema(schema, R"({"a":1})"));          // b is required
  EXPECT_FALSE(AcceptsSchema(schema, R"({"b":"x","a":1})"));  // schema order
  EXPECT_FALSE(AcceptsSchema(schema, R"({"b":"x","d":1})"));  // closed
  EXPECT_FALSE(AcceptsSchema(schema, R"({,"b":"x"})"));
  EXPECT_FALSE(AcceptsSchema(schema, R"({"b":  "x"})"));  // one space at most
}

TEST(GrammarTest, StrictClosesObjectsAndOpenObjectsTakeUndeclaredKeys) {
  const Json schema =
      Json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  EXPECT_TRUE(AcceptsSchema(schema, R"({"a":1,"zz":[1,{"q":null}]})", /*strict=*/false));
  EXPECT_FALSE(AcceptsSchema(schema, R"({"a":1,"zz":2})", /*strict=*/true));
  // An undeclared key never repeats a declared name (it would be validated
  // against the declared schema).
  EXPECT_FALSE(AcceptsSchema(schema, R"({"a":"x"})", false));
  EXPECT_FALSE(AcceptsSchema(schema, R"({"a":1,"a":"x"})", false));
  EXPECT_TRUE(AcceptsSchema(schema, R"({"a":1,"ab":"x","":2})", false));
}

TEST(GrammarTest, ArraysEnumsAnyOfAndRefs) {
  EXPECT_TRUE(AcceptsSchema({{"type", "array"}, {"items", {{"type", "integer"}}}}, "[1, 2,3]"));
  EXPECT_TRUE(AcceptsSchema({{"type", "array"}, {"items", {{"type", "integer"}}}}, "[]"));
  const Json bounded = {
      {"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 2}, {"maxItems", 3}};
  EXPECT_FALSE(AcceptsSchema(bounded, "[1]"));
  EXPECT_TRUE(AcceptsSchema(bounded, "[1,2]"));
  EXPECT_TRUE(AcceptsSchema(bounded, "[1,2,3]"));
  EXPECT_FALSE(AcceptsSchema(bounded, "[1,2,3,4]"));
  const Json tuple =
      Json::parse(R"({"prefixItems": [{"type": "string"}, {"const": 7}], "items": false})");
  EXPECT_TRUE(AcceptsSchema(tuple, R"(["x",7])"));
  EXPECT_TRUE(AcceptsSchema(tuple, R"(["x"])"));
  EXPECT_FALSE(AcceptsSchema(tuple, R"(["x",7,1])"));
  const Json e = Json::parse(R"({"enum": ["a\"b", 1.5, null, {"k": [true]}]})");
  EXPECT_TRUE(AcceptsSchema(e, R"("a\"b")"));
  EXPECT_TRUE(AcceptsSchema(e, R"({"k":[true]})"));
  EXPECT_FALSE(AcceptsSchema(e, R"("ab")"));
  const Json tree = Json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"], "additionalProperties": false}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(AcceptsSchema(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(AcceptsSchema(tree, R"({"v":1,"kids":[{"w":2}]})"));
  const Json any_of = Json::parse(R"({"anyOf": [
    {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"], "additionalProperties": false},
    {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "null"}}, "required": ["x", "y"], "additionalProperties": false}]})");
  EXPECT_TRUE(AcceptsSchema(any_of, R"({"x":"s"})"));
  EXPECT_TRUE(AcceptsSchema(any_of, R"({"x":2,"y":null})"));
  EXPECT_FALSE(AcceptsSchema(any_of, R"({"x":2})"));
}

TEST(GrammarTest, UnsupportedKeywordsAreNamed) {
  for (const char* k : {"pattern", "format", "minLength", "minimum", "not", "uniqueItems"}) {
    Json schema = {{"type", "string"}};
    schema[k] = k == std::string("uniqueItems") ? Json(true) : Json("x");
    const absl::Status s = SchemaStatus(schema);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("\"", k, "\""))) << s;
  }
  const absl::Status nested = SchemaStatus(Json::parse(
      R"({"type":"object","properties":{"when":{"type":"string","format":"date-time"}}})"));
  EXPECT_THAT(nested.message(), HasSubstr("#/properties/when")) << nested;
  EXPECT_THAT(SchemaStatus(Json::parse(R"({"$ref": "https://example.com/s.json"})")).message(),
              HasSubstr("$ref"));
  EXPECT_THAT(SchemaStatus(Json::parse(R"({"$ref": "#/$defs/missing"})")).message(),
              HasSubstr("does not resolve"));
  EXPECT_THAT(SchemaStatus(Json(false)).message(), HasSubstr("no value is valid"));
  EXPECT_THAT(
      SchemaStatus(Json::parse(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"))
          .message(),
      HasSubstr("unsatisfiable"));
  EXPECT_THAT(
      SchemaStatus(Json::parse(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})")).message(),
      HasSubstr("left recursion"));
  // Unknown keywords and annotations are ignored.
  EXPECT_TRUE(
      SchemaStatus(
          Json::parse(
              R"({"type":"string","title":"t","description":"d","x-vendor":1,"default":"a"})"))
          .ok());
}

// The mask of every state equals a brute-force check of each token.
TEST(GrammarTest, MaskMatchesBruteForce) {
  int eos = 0;
  auto vocab = TestVocab(&eos);
  const Json schema = Json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b"]}},
      "x":{"anyOf":[{"type":"number"},{"type":"null"}]}},"required":["name"]})");
  auto compiled = Compile(JsonSchemaSpec(schema, false), vocab);
  ASSERT_NE(compiled, nullptr);
  const Grammar& g = compiled->grammar();
  const std::string text =
      R"({"name": "hello\n \u00e9\u00e9", "age":-12, "tags":["a","b"],"x":3.5e+2, "q": {"r": [1,"s",null]}})";
  ASSERT_TRUE(Accepts(g, text));
  const int words = TokenMaskWords(vocab->size());
  std::vector<int32_t> generated;
  GrammarMatcher matcher(compiled);
  for (size_t pos = 0; pos <= text.size(); ++pos) {
    ASSERT_TRUE(matcher.Sync(generated));
    std::vector<uint32_t> mask(words);
    matcher.FillMask(/*remaining=*/1000, vocab->eos_ids(), mask);
    // Brute force from the text so far.
    for (int id = 0; id < vocab->size(); ++id) {
      bool expect;
      if (id == eos) {
        expect = pos == text.size();
      } else if (vocab->bytes(id).empty()) {
        expect = false;
      } else {
        StackArena arena(g);
        StepOut state = StartState(g, arena), scratch;
        ASSERT_TRUE(pos == 0 || AdvanceBytes(g, arena, text.substr(0, pos), state, scratch));
        expect = AdvanceBytes(g, arena, vocab->bytes(id), state, scratch);
      }
      EXPECT_EQ(TokenAllowed(mask, id), expect)
          << "at " << pos << " (\"" << text.substr(0, pos) << "\") token " << id << " \""
          << vocab->bytes(id) << "\"";
    }
    if (pos < text.size()) generated.push_back(static_cast<uint8_t>(text[pos]));
  }
}

// Near the end of a budget the mask keeps exactly the tokens after which
// the shortest completion still fits (the accepted set less the tokens
// growing past the slack), as a check of every token says.
TEST(GrammarTest, BudgetMaskMatchesBruteForce) {
  int eos = 0;
  auto vocab = TestVocab(&eos);
  const Json schema = Json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"tags":{"type":"array","items":{"enum":["a","bb"]}},
      "x":{"anyOf":[{"type":"number"},{"type":"null"}]}},"required":["name","tags"]})");
  auto compiled = Compile(JsonSchemaSpec(schema, true), vocab);
  ASSERT_NE(compiled, nullptr);
  const Grammar& g = compiled->grammar();
  const std::string text = R"({"name": "he\n", "tags":["a","bb"], "x":null})";
  ASSERT_TRUE(Accepts(g, text));
  const int words = TokenMaskWords(vocab->size());
  int compared = 0;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    std::vector<int32_t> generated;
    for (size_t i = 0; i < pos; ++i) generated.push_back(static_cast<uint8_t>(text[i]));
    for (int remaining = 2; remaining < 40; ++remaining) {
      GrammarMatcher matcher(compiled);
      ASSERT_TRUE(matcher.Sync(generated));
      std::vector<uint32_t> mask(words);
      matcher.FillMask(remaining, vocab->eos_ids(), mask);
      const int32_t limit = remaining - 2;
      std::vector<bool> expect(vocab->size(), false);
      bool any = false;
      for (int id = 0; id < vocab->size(); ++id) {
        if (vocab->bytes(id).empty()) continue;
        StackArena arena(g);
        StepOut state = StartState(g, arena), scratch;
        ASSERT_TRUE(pos == 0 || AdvanceBytes(g, arena, text.substr(0, pos), state, scratch));
        if (AdvanceBytes(g, arena, vocab->bytes(id), state, scratch) &&
            MinToFinish(arena, state) <= limit) {
          expect[id] = true;
          any = true;
        }
      }
      if (!any) continue;  // the mask drops the budget instead (tested elsewhere)
      ++compared;
      for (int id = 0; id < vocab->size(); ++id) {
        if (id == eos) continue;
        EXPECT_EQ(TokenAllowed(mask, id), expect[id])
            << "at " << pos << " (\"" << text.substr(0, pos) << "\") remaining " << remaining
            << " token \"" << vocab->bytes(id) << "\"";
      }
    }
  }
  EXPECT_GT(compared, 200);
}

// Sampling uniformly among allowed tokens always gives a complete output
// within the token budget, however small (down to the shortest output).
TEST(GrammarTest, RandomGenerationFinishesWithinBudget) {
  int eos = 0;
  auto vocab = TestVocab(&eos);
  const Json schema = Json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"n":{"type":"number"},"items":{"type":"array","items":{"$ref":"#"}}},
      "required":["name","n","items"],"additionalProperties":false})");
  auto compiled = Compile(JsonSchemaSpec(schema, false), vocab);
  ASSERT_NE(compiled, nullptr);
  const int min_len = compiled->grammar().MinLength();
  std::mt19937 rng(7);
  const int words = TokenMaskWords(vocab->size());
  for (int trial = 0; trial < 60; ++trial) {
    // The shortest output and its end-of-sequence, and up to 80 more.
    const int max_tokens = min_len + 1 + static_cast<int>(rng() % 80);
    GrammarMatcher matcher(compiled);
    std::vector<int32_t> generated;
    std::string text;
    bool ended = false;
    for (int step = 0; step < max_tokens; ++step) {
      ASSERT_TRUE(matcher.Sync(generated));
      std::vector<uint32_t> mask(words);
      matcher.FillMask(max_tokens - step, vocab->eos_ids(), mask);
      std::vector<int32_t> allowed;
      for (int id = 0; id < vocab->size(); ++id) {
        if (TokenAllowed(mask, id)) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      // Prefer continuing: EOS only one time in four when allowed.
      int32_t tok = allowed[rng() % allowed.size()];
      if (tok == eos && allowed.size() > 1 && rng() % 4 != 0) {
        tok = allowed[(std::find(allowed.begin(), allowed.end(), eos) - allowed.begin() + 1) %
                      allowed.size()];
      }
      if (tok == eos) {
        ended = true;
        break;
      }
      generated.push_back(tok);
      text += vocab->bytes(tok);
    }
    ASSERT_TRUE(Accepts(compiled->grammar(), text)) << "trial " << trial << ": " << text;
    const Json parsed = Json::parse(text, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << text;
    EXPECT_TRUE(parsed.contains("name") && parsed["name"].is_string()) << text;
    // One token is kept for the end: the reply stops rather than running
    // into max_tokens.
    EXPECT_TRUE(ended) << "trial " << trial << ": " << text;
  }
}

TEST(GrammarTest, MigrationReplaysTheHistory) {
  auto vocab = TestVocab();
  auto compiled =
      Compile(JsonSchemaSpec({{"type", "array"}, {"items", {{"type", "string"}}}}, false), vocab);
  ASSERT_NE(compiled, nullptr);
  GrammarCompiler compiler(vocab);
  const std::string spec =
      JsonSchemaSpec({{"type", "array"}, {"items", {{"type", "string"}}}}, false).dump();
  auto a = compiler.Compile(spec);
  auto b = compiler.Compile(spec);
  ASSERT_TRUE(a.ok() && b.ok());
  const int words = TokenMaskWords(vocab->size());
  const std::vector<int32_t> history = {'[', '"', 'x', '"', ','};
  // `a` followed the tokens one by one; `b` sees them all at once (another
  // worker after a migration) and after a different history (rollback).
  std::vector<uint32_t> ma(words), mb(words);
  for (size_t k = 0; k <= history.size(); ++k) {
    (*a)->FillMask(std::span(history).first(k), 100, vocab->eos_ids(), ma);
  }
  (*b)->FillMask(std::vector<int32_t>{'[', '"', 'q'}, 100, vocab->eos_ids(), mb);
  (*b)->FillMask(history, 100, vocab->eos_ids(), mb);
  EXPECT_EQ(ma, mb);
  EXPECT_TRUE(TokenAllowed(ma, '"'));
  EXPECT_FALSE(TokenAllowed(ma, ']'));
}

TEST(GrammarTest, HistoryOutsideTheGrammarEnds) {
  int eos = 0;
  auto vocab = TestVocab(&eos);
  GrammarCompiler compiler(vocab);
  auto c = compiler.Compile(JsonObjectSpec().dump());
  ASSERT_TRUE(c.ok());
  std::vector<uint32_t> mask(TokenMaskWords(vocab->size()));
  (*c)->FillMask(std::vector<int32_t>{'x'}, 10, vocab->eos_ids(), mask);
  for (int id = 0; id < vocab->size(); ++id) EXPECT_EQ(TokenAllowed(mask, id), id == eos) << id;
}

}  // namespace
}  // namespace pdserve::engine::grammar
