// Unit tests for the byte-level BPE tokenizer (text/bpe_tokenizer), its
// pre-tokenizer (text/pretokenizer), NFC normalization and the loader, on
// tiny hand-written tokenizer.json fixtures: merge order, ignore_merges,
// added tokens (special, lstrip/rstrip, single_word, normalized), byte
// fallback and unk, the Llama 3 / Qwen2 split regexes on tricky strings,
// decoding and streaming of multi-byte tokens, and hostile files.
// The real Llama 3 / Qwen3 files are checked in tests/tokenizer_reference.
#include "text/bpe_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/pretokenizer.h"
#include "text/split_patterns.h"
#include "text/tokenizer_loader.h"

namespace pdserve::text {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

const std::string kLlama3Regex(split_patterns::kLlama3);
const std::string kQwen2Regex(split_patterns::kQwen2);

// A byte-level tokenizer.json: ids 0..255 are the 256 single bytes (id b =
// byte b, written in the byte-level alphabet), then `merges` in order, each
// adding its merged token. `extra_vocab` adds whole tokens without merges.
struct Fixture {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes
  std::vector<std::string> extra_vocab;                     // raw bytes
  Json added_tokens = Json::array();
  Json normalizer = nullptr;
  std::string regex = kLlama3Regex;
  bool ignore_merges = false;
  bool pairs_format = false;  // merges as [a, b] instead of "a b"

  std::string ToJson() const {
    Json vocab = Json::object();
    int next = 0;
    for (int b = 0; b < 256; ++b) vocab[ByteLevelAlphabet::Char(static_cast<uint8_t>(b))] = next++;
    Json merge_list = Json::array();
    for (const auto& [a, b] : merges) {
      const std::string ea = ByteLevelAlphabet::Encode(a), eb = ByteLevelAlphabet::Encode(b);
      if (!vocab.contains(ea + eb)) vocab[ea + eb] = next++;
      if (pairs_format) {
        merge_list.push_back(Json::array({ea, eb}));
      } else {
        merge_list.push_back(ea + " " + eb);
      }
    }
    for (const std::string& t : extra_vocab) vocab[ByteLevelAlphabet::Encode(t)] = next++;
    Json root = {{"version", "1.0"},
                 {"added_tokens", added_tokens},
                 {"normalizer", normalizer},
                 {"pre_tokenizer",
                  {{"type", "Sequence"},
                   {"pretokenizers", Json::array({{{"type", "Split"},
                                                   {"pattern", {{"Regex", regex}}},
                                                   {"behavior", "Isolated"},
                                                   {"invert", false}},
                                                  {{"type", "ByteLevel"},
                                                   {"add_prefix_space", false},
                                                   {"trim_offsets", true},
                                                   {"use_regex", false}}})}}},
                 {"post_processor", {{"type", "ByteLevel"}}},
                 {"decoder", {{"type", "ByteLevel"}}},
                 {"model",
                  {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"ignore_merges", ignore_merges},
                   {"vocab", vocab},
                   {"merges", merge_list}}}};
    return root.dump();
  }
};

Json Added(int id, const std::string& content, bool special, bool lstrip = false,
           bool rstrip = false, bool normalized = false, bool single_word = false) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

std::unique_ptr<BpeTokenizer> Make(const Fixture& f, const std::string& config = "") {
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> t = BpeTokenizer::FromJson(f.ToJson(), config);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

// ---------------------------------------------------------- alphabet ----

TEST(ByteLevelAlphabetTest, MapsEveryByteAndBack) {
  EXPECT_EQ(ByteLevelAlphabet::Char(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(ByteLevelAlphabet::Char('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(ByteLevelAlphabet::Char('a'), "a");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(ByteLevelAlphabet::Decode(ByteLevelAlphabet::Encode(all)), all);
  EXPECT_EQ(ByteLevelAlphabet::Decode("caf\xC3\xA9"), "caf\xE9");  // é stands for byte E9
  EXPECT_EQ(ByteLevelAlphabet::Decode("\xC5\x84"), std::nullopt);  // ń is not in the alphabet
  EXPECT_EQ(ByteLevelAlphabet::Decode("\xFF"), std::nullopt);      // not UTF-8
}

// ------------------------------------------------------ pre-tokenizer ----

std::vector<std::string> SplitWith(const std::string& regex, std::string_view text) {
  absl::StatusOr<std::unique_ptr<RegexSplitter>> r = RegexSplitter::Create(regex);
  EXPECT_TRUE(r.ok()) << r.status();
  absl::StatusOr<PreTokenizer> p =
      PreTokenizer::Create({SplitStep{std::shared_ptr<const RegexSplitter>(*std::move(r))}});
  EXPECT_TRUE(p.ok()) << p.status();
  return p->Split(text);
}

TEST(PreTokenizerTest, Llama3SplitsTrickyStrings) {
  EXPECT_THAT(SplitWith(kLlama3Regex, "Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(SplitWith(kLlama3Regex, "I'm YOU'RE it'S"),
              ElementsAre("I", "'m", " YOU", "'RE", " it", "'S"));
  EXPECT_THAT(SplitWith(kLlama3Regex, "1234567"), ElementsAre("123", "456", "7"));
  EXPECT_THAT(SplitWith(kLlama3Regex, "a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(SplitWith(kLlama3Regex, "a\n\n b"), ElementsAre("a", "\n\n", " b"));
  EXPECT_THAT(SplitWith(kLlama3Regex, "x   "), ElementsAre("x", "   "));
  EXPECT_THAT(SplitWith(kLlama3Regex, "f(x):\n\treturn"),
              ElementsAre("f", "(x", "):\n", "\treturn"));
  EXPECT_THAT(SplitWith(kLlama3Regex, "\xE4\xBD\xA0\xE5\xA5\xBD!!"),  // 你好!!
              ElementsAre("\xE4\xBD\xA0\xE5\xA5\xBD", "!!"));
  EXPECT_THAT(SplitWith(kLlama3Regex, "caf\xC3\xA9 \xF0\x9F\x98\x80\xF0\x9F\x98\x80"),  // café 😀😀
              ElementsAre("caf\xC3\xA9", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80"));
}

TEST(PreTokenizerTest, Qwen2SplitsDigitsOneByOne) {
  EXPECT_THAT(SplitWith(kQwen2Regex, "x=12345"), ElementsAre("x", "=", "1", "2", "3", "4", "5"));
}

TEST(PreTokenizerTest, WhitespaceIsUnicodeWhiteSpace) {
  // \s follows Unicode White_Space (Oniguruma, hence HF): U+0085 and U+3000
  // are spaces; U+180E and U+FEFF are not (PCRE2's own \s takes U+180E).
  EXPECT_THAT(SplitWith(R"(\s+)",
                        "a\xC2\x85"
                        "b"),
              ElementsAre("a", "\xC2\x85", "b"));
  EXPECT_THAT(SplitWith(R"(\s+)",
                        "a\xE3\x80\x80"
                        "b"),
              ElementsAre("a", "\xE3\x80\x80", "b"));
  EXPECT_THAT(SplitWith(R"(\s+)",
                        "a\xE1\xA0\x8E"
                        "b"),
              ElementsAre("a\xE1\xA0\x8E"
                          "b"));
  EXPECT_THAT(SplitWith(R"(\S+)",
                        "a\xEF\xBB\xBF"
                        "b c"),
              ElementsAre("a\xEF\xBB\xBF"
                          "b",
                          " ", "c"));
  // \S inside a class is the complement of White_Space.
  EXPECT_THAT(SplitWith(R"([^\S]+)",
                        "a \xE3\x80\x80"
                        "b"),
              ElementsAre("a", " \xE3\x80\x80", "b"));
}

TEST(PreTokenizerTest, SplitBehaviours) {
  auto run = [](SplitBehavior behavior, bool invert) {
    absl::StatusOr<std::unique_ptr<RegexSplitter>> r = RegexSplitter::Create("-", /*literal=*/true);
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return std::vector<std::string>{};
    }
    absl::StatusOr<PreTokenizer> p = PreTokenizer::Create(
        {SplitStep{std::shared_ptr<const RegexSplitter>(*std::move(r)), behavior, invert}});
    return p->Split("a-b--c");
  };
  EXPECT_THAT(run(SplitBehavior::kIsolated, false), ElementsAre("a", "-", "b", "-", "-", "c"));
  EXPECT_THAT(run(SplitBehavior::kRemoved, false), ElementsAre("a", "b", "c"));
  EXPECT_THAT(run(SplitBehavior::kMergedWithPrevious, false), ElementsAre("a-", "b-", "-", "c"));
  EXPECT_THAT(run(SplitBehavior::kMergedWithNext, false), ElementsAre("a", "-b", "-", "-c"));
  EXPECT_THAT(run(SplitBehavior::kContiguous, false), ElementsAre("a", "-", "b", "--", "c"));
  EXPECT_THAT(run(SplitBehavior::kRemoved, true), ElementsAre("-", "-", "-"));
}

TEST(PreTokenizerTest, ByteLevelGpt2RegexAndPrefixSpace) {
  absl::StatusOr<PreTokenizer> p = PreTokenizer::Create({ByteLevelStep{true, true}});
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(p->Split("Hello world's  end"), ElementsAre(" Hello", " world", "'s", " ", " end"));
}

TEST(RegexSplitterTest, BadPatternIsAnError) {
  EXPECT_FALSE(RegexSplitter::Create("(unclosed").ok());
  EXPECT_FALSE(RegexSplitter::Create("[a-").ok());
  EXPECT_FALSE(RegexSplitter::Create("").ok());
}

// ---------------------------------------------------------------- BPE ----

TEST(BpeTokenizerTest, MergesApplyLowestRankFirst) {
  Fixture f;
  f.merges = {{"b", "c"}, {"a", "b"}, {"a", "bc"}};  // ranks 0, 1, 2
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  const int32_t bc = 256, abc = 258;
  // "abc": (b,c) has the lower rank, so a + bc, then (a, bc) -> abc.
  EXPECT_THAT(tok->Encode("abc"), ElementsAre(abc));
  // "abd": only (a,b) applies.
  EXPECT_THAT(tok->Encode("abd"), ElementsAre(257, 'd'));
  EXPECT_THAT(tok->Encode("bcbc"), ElementsAre(bc, bc));
  EXPECT_EQ(tok->TokenBytes(abc), "abc");
  EXPECT_EQ(tok->TokenId(ByteLevelAlphabet::Encode("bc")), bc);
}

TEST(BpeTokenizerTest, EqualPairsMergeLeftmostFirst) {
  Fixture f;
  f.merges = {{"a", "a"}};
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("aaa"), ElementsAre(256, 'a'));
  EXPECT_THAT(tok->Encode("aaaa"), ElementsAre(256, 256));
}

TEST(BpeTokenizerTest, PairMergeFormatAndSpacesInTokens) {
  Fixture f;
  f.pairs_format = true;
  f.merges = {{" ", " "}, {"  ", "  "}, {" ", "x"}};
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  // "    x" splits as "   " + " x" (\s+(?!\S)); "   " -> "  " + " ".
  EXPECT_THAT(tok->Encode("    x"), ElementsAre(256, ' ', 258));
}

TEST(BpeTokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  Fixture f;
  f.merges = {{"h", "e"}, {"l", "l"}};
  f.extra_vocab = {"hello"};  // no merge path builds it
  f.ignore_merges = false;
  auto plain = Make(f);
  f.ignore_merges = true;
  auto ignoring = Make(f);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_THAT(plain->Encode("hello"), ElementsAre(256, 257, 'o'));
  EXPECT_THAT(ignoring->Encode("hello"), ElementsAre(258));
  EXPECT_THAT(ignoring->Encode("hellos"), ElementsAre(256, 257, 'o', 's'));
}

TEST(BpeTokenizerTest, EncodeDecodeRoundTripsAnyText) {
  Fixture f;
  f.merges = {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"\xE4", "\xBD"}};
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  const std::string text =
      "the other  \t\n\nthe 123456 caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD "
      "\xF0\x9F\x91\xA8\xE2\x80\x8D"
      "\xF0\x9F\x91\xA9 it's";
  const std::vector<int32_t> ids = tok->Encode(text);
  EXPECT_EQ(tok->Decode(ids), text);
  EXPECT_EQ(ids[0], 257);  // "the"
  EXPECT_EQ(tok->vocab_size(), 260);
}

TEST(BpeTokenizerTest, InvalidUtf8InputIsRepaired) {
  Fixture f;
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("a\xFF"
                        "b"),
            Bytes("a\xEF\xBF\xBD"
                  "b"));
  EXPECT_EQ(tok->Encode("\xE4\xBD"), Bytes("\xEF\xBF\xBD"));
}

// ------------------------------------------------------- added tokens ----

TEST(BpeTokenizerTest, AddedTokensAreCutOutFirst) {
  Fixture f;
  f.merges = {{"<", "|"}};
  f.added_tokens = Json::array({Added(300, "<|im_start|>", true), Added(301, "<|im_end|>", true),
                                Added(302, "<think>", false), Added(303, "<|im_start|>x", true)});
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("<|im_start|>user\nhi<|im_end|>"),
              ElementsAre(300, 'u', 's', 'e', 'r', '\n', 'h', 'i', 301));
  // Leftmost-longest: "<|im_start|>x" wins over "<|im_start|>".
  EXPECT_THAT(tok->Encode("<|im_start|>xy"), ElementsAre(303, 'y'));
  // Near misses stay text.
  EXPECT_THAT(tok->Encode("<|im_end |>"),
              ElementsAre(256, 'i', 'm', '_', 'e', 'n', 'd', ' ', '|', '>'));
  // EncodeOrdinary leaves special tokens as text but still matches <think>.
  const std::vector<int32_t> ordinary = tok->EncodeOrdinary("<|im_end|><think>");
  EXPECT_THAT(ordinary, ElementsAre(256, 'i', 'm', '_', 'e', 'n', 'd', '|', '>', 302));
  EXPECT_EQ(tok->Decode(ordinary), "<|im_end|><think>");
}

TEST(BpeTokenizerTest, SpecialTokensDecodeToContentUnlessSkipped) {
  Fixture f;
  f.added_tokens = Json::array({Added(256, "<|eot|>", true), Added(257, "<think>", false)});
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode("<think>a<|eot|>");
  EXPECT_THAT(ids, ElementsAre(257, 'a', 256));
  EXPECT_EQ(tok->Decode(ids, /*skip_special_tokens=*/false), "<think>a<|eot|>");
  EXPECT_EQ(tok->Decode(ids, /*skip_special_tokens=*/true), "<think>a");
  EXPECT_TRUE(tok->IsSpecial(256));
  EXPECT_FALSE(tok->IsSpecial(257));
  EXPECT_EQ(tok->TokenBytes(256), "");
  EXPECT_EQ(tok->SpecialTokenText(256), "<|eot|>");
  EXPECT_EQ(tok->TokenBytes(257), "<think>");
  EXPECT_EQ(tok->TokenId("<|eot|>"), 256);
  EXPECT_EQ(tok->TokenId("nope"), std::nullopt);
  EXPECT_EQ(tok->TokenBytes(-1), "");
  EXPECT_EQ(tok->TokenBytes(100000), "");
}

TEST(BpeTokenizerTest, LstripRstripAbsorbWhitespace) {
  Fixture f;
  f.added_tokens = Json::array({Added(300, "<mask>", true, /*lstrip=*/true, /*rstrip=*/true)});
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a  <mask>\t b"), ElementsAre('a', 300, 'b'));
}

TEST(BpeTokenizerTest, SingleWordTokensMatchOnlyWholeWords) {
  Fixture f;
  f.added_tokens =
      Json::array({Added(300, "cat", false, false, false, false, /*single_word=*/true)});
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a cat!"), ElementsAre('a', ' ', 300, '!'));
  EXPECT_THAT(tok->Encode("concat"), ElementsAre('c', 'o', 'n', 'c', 'a', 't'));
}

TEST(BpeTokenizerTest, NfcNormalizerAndNormalizedAddedTokens) {
  Fixture f;
  f.normalizer = {{"type", "NFC"}};
  f.added_tokens =
      Json::array({Added(300, "\xC3\xA9t\xC3\xA9", false, false, false, /*normalized=*/true)});
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  // "e\u0301" composes to "é" (C3 A9) before pre-tokenization.
  EXPECT_EQ(tok->Encode("e\xCC\x81"), Bytes("\xC3\xA9"));
  // Hangul jamo compose to a syllable: 각 (EA B0 81).
  EXPECT_EQ(tok->Encode("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), Bytes("\xEA\xB0\x81"));
  // The normalized added token "été" matches decomposed input.
  EXPECT_THAT(tok->Encode("e\xCC\x81te\xCC\x81!"), ElementsAre(300, '!'));
}

TEST(BpeTokenizerTest, ByteFallbackAndUnk) {
  // A vocabulary without the bytes of "é": byte_fallback uses <0xC3><0xA9>.
  Json vocab = Json::object();
  int id = 0;
  for (char c : std::string("abc")) vocab[std::string(1, c)] = id++;
  vocab["<0xC3>"] = id++;
  vocab["<0xA9>"] = id++;
  vocab["<unk>"] = id++;
  auto make = [&](bool byte_fallback, bool fuse_unk) {
    Json root = {{"added_tokens", Json::array()},
                 {"normalizer", nullptr},
                 {"pre_tokenizer",
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
                 {"decoder", {{"type", "ByteLevel"}}},
                 {"model",
                  {{"type", "BPE"},
                   {"unk_token", "<unk>"},
                   {"byte_fallback", byte_fallback},
                   {"fuse_unk", fuse_unk},
                   {"vocab", vocab},
                   {"merges", Json::array()}}}};
    auto t = BpeTokenizer::FromJson(root.dump());
    EXPECT_TRUE(t.ok()) << t.status();
    return *std::move(t);
  };
  auto fallback = make(true, false);
  EXPECT_THAT(fallback->Encode("a\xC3\xA9"), ElementsAre(0, 3, 4));
  EXPECT_EQ(fallback->Decode(fallback->Encode("a\xC3\xA9")), "a\xC3\xA9");
  auto unk = make(false, false);
  EXPECT_THAT(unk->Encode("a\xC3\xA9"
                          "b"),
              ElementsAre(0, 5, 5, 1));
  auto fused = make(false, true);
  EXPECT_THAT(fused->Encode("a\xC3\xA9"
                            "b"),
              ElementsAre(0, 5, 1));
}

// ------------------------------------------------- BOS / EOS / config ----

TEST(BpeTokenizerTest, TemplateProcessingAndConfigNameBosAndEos) {
  Fixture f;
  f.added_tokens =
      Json::array({Added(256, "<|begin_of_text|>", true), Added(257, "<|eot_id|>", true)});
  Json root = Json::parse(f.ToJson());
  Json bos_piece = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  Json seq_piece = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  Json specials = Json::object();
  specials["<|begin_of_text|>"] = {{"id", "<|begin_of_text|>"}, {"ids", Json::array({256})}};
  Json templ = {{"type", "TemplateProcessing"},
                {"single", Json::array({bos_piece, seq_piece})},
                {"special_tokens", specials}};
  root["post_processor"] = {{"type", "Sequence"},
                            {"processors", Json::array({Json{{"type", "ByteLevel"}}, templ})}};
  const std::string config =
      R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})";
  auto tok = BpeTokenizer::FromJson(root.dump(), config);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->prefix_tokens(), ElementsAre(256));
  EXPECT_TRUE((*tok)->suffix_tokens().empty());
  EXPECT_EQ((*tok)->bos_token_id(), 256);
  EXPECT_EQ((*tok)->eos_token_id(), 257);
  EXPECT_TRUE((*tok)->add_bos_token());
  // Encode never adds BOS.
  EXPECT_THAT((*tok)->Encode("a"), ElementsAre('a'));

  // "add_bos_token": false in the config wins; a plain ByteLevel
  // post-processor adds nothing.
  auto off = BpeTokenizer::FromJson(
      root.dump(), R"({"bos_token": "<|begin_of_text|>", "add_bos_token": false})");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE((*off)->add_bos_token());
  auto plain = Make(f, R"({"bos_token": null, "eos_token": "<|eot_id|>"})");
  EXPECT_FALSE(plain->add_bos_token());
  EXPECT_EQ(plain->bos_token_id(), std::nullopt);
}

// ------------------------------------------------------------ streaming ----

TEST(BpeTokenizerTest, IncrementalDetokenizerHoldsSplitCharacters) {
  // "你" is E4 BD A0: a token for E4 BD, then the byte A0.
  Fixture f;
  f.merges = {{"\xE4", "\xBD"}, {" ", "\xE4\xBD"}};
  f.added_tokens = Json::array({Added(400, "<|eot|>", true)});
  auto tok = Make(f);
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode(" \xE4\xBD\xA0!");
  ASSERT_THAT(ids, ElementsAre(257, 0xA0, '!'));
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.Push(257), " ");  // E4 BD held back
  EXPECT_EQ(detok.Push(400), "");   // a skipped special token keeps them
  EXPECT_EQ(detok.Push(0xA0), "\xE4\xBD\xA0");
  EXPECT_EQ(detok.Push('!'), "!");
  EXPECT_EQ(detok.Flush(), "");
  // Keeping specials: the special token's text ends the incomplete character.
  IncrementalDetokenizer keep(*tok, /*skip_special_tokens=*/false);
  EXPECT_EQ(keep.Push(257), " ");
  EXPECT_EQ(keep.Push(400), "\xEF\xBF\xBD<|eot|>");
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{257, 400}, false), " \xEF\xBF\xBD<|eot|>");
}

// --------------------------------------------------------- hostile files ----

TEST(BpeTokenizerTest, HostileFilesAreErrors) {
  Fixture f;
  f.merges = {{"a", "b"}};
  const Json good = Json::parse(f.ToJson());
  auto expect_error = [](const std::string& text, absl::StatusCode code, const std::string& what) {
    auto t = BpeTokenizer::FromJson(text);
    ASSERT_FALSE(t.ok()) << what;
    EXPECT_EQ(t.status().code(), code) << what << ": " << t.status();
  };
  const auto invalid = absl::StatusCode::kInvalidArgument;
  const auto unimplemented = absl::StatusCode::kUnimplemented;
  expect_error("", invalid, "empty");
  expect_error("{", invalid, "truncated");
  expect_error("[]", invalid, "not an object");
  expect_error(std::string(100000, '[') + std::string(100000, ']'), invalid, "deep nesting");
  expect_error(good.dump().substr(0, good.dump().size() / 2), invalid, "cut in half");
  auto mutate = [&](auto edit) {
    Json j = good;
    edit(j);
    return j.dump();
  };
  expect_error(mutate([](Json& j) { j.erase("model"); }), invalid, "no model");
  expect_error(mutate([](Json& j) { j["model"]["vocab"] = Json::array(); }), invalid,
               "vocab array");
  expect_error(mutate([](Json& j) { j["model"]["vocab"]["x"] = -1; }), invalid, "negative id");
  expect_error(mutate([](Json& j) { j["model"]["vocab"]["x"] = 2000000000; }), invalid, "huge id");
  expect_error(mutate([](Json& j) { j["model"]["vocab"]["x"] = "7"; }), invalid, "string id");
  expect_error(mutate([](Json& j) { j["model"]["vocab"]["x"] = 3; }), invalid, "duplicate id");
  expect_error(mutate([](Json& j) { j["model"]["merges"] = Json::array({"a b c"}); }), invalid,
               "3-part merge");
  expect_error(mutate([](Json& j) { j["model"]["merges"] = Json::array({"a zz"}); }), invalid,
               "unknown merge part");
  expect_error(mutate([](Json& j) { j["model"]["merges"] = Json::array({42}); }), invalid,
               "merge number");
  expect_error(mutate([](Json& j) { j["model"]["unk_token"] = "<nope>"; }), invalid, "unknown unk");
  expect_error(mutate([](Json& j) { j["model"]["ignore_merges"] = "yes"; }), invalid,
               "string bool");
  expect_error(mutate([](Json& j) {
                 j["added_tokens"] = Json::array({{{"id", 5}}});
               }),
               invalid, "no content");
  expect_error(mutate([](Json& j) { j["added_tokens"] = Json::array({Added(-3, "x", true)}); }),
               invalid, "added id");
  expect_error(mutate([](Json& j) { j["added_tokens"] = "x"; }), invalid, "added not array");
  expect_error(
      mutate([](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(("; }),
      invalid, "bad regex");
  expect_error(
      mutate([](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; }),
      invalid, "bad behaviour");
  expect_error(mutate([](Json& j) { j["model"]["type"] = "WordPiece"; }), unimplemented,
               "WordPiece");
  expect_error(mutate([](Json& j) {
                 j["pre_tokenizer"] = {{"type", "Whitespace"}};
               }),
               unimplemented, "Whitespace");
  expect_error(mutate([](Json& j) {
                 j["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}};
               }),
               invalid, "Metaspace prepend_scheme");
  expect_error(mutate([](Json& j) {
                 j["pre_tokenizer"] = {{"type", "Metaspace"},
                                       {"prepend_scheme", "first"},
                                       {"add_prefix_space", false}};
               }),
               invalid, "Metaspace add_prefix_space contradicts prepend_scheme");
  expect_error(mutate([](Json& j) {
                 j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
               }),
               invalid, "Metaspace replacement of two characters");
  expect_error(
      mutate([](Json& j) {
        j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "(("}}}, {"content", "x"}};
      }),
      invalid, "bad Replace regex");
  expect_error(mutate([](Json& j) {
                 j["normalizer"] = {{"type", "Prepend"}, {"prepend", 5}};
               }),
               invalid, "Prepend number");
  expect_error(
      mutate([](Json& j) {
        j["decoder"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", " "}};
      }),
      unimplemented, "decoder Replace regex");
  expect_error(mutate([](Json& j) {
                 j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}};
               }),
               invalid, "decoder Strip negative");
  expect_error(mutate([](Json& j) {
                 j["decoder"] = {{"type", "CTC"}};
               }),
               unimplemented, "decoder CTC");
  expect_error(mutate([](Json& j) {
                 j["normalizer"] = {{"type", "Lowercase"}};
               }),
               unimplemented, "Lowercase");
  expect_error(mutate([](Json& j) { j["model"]["dropout"] = 0.1; }), unimplemented, "dropout");
  EXPECT_TRUE(BpeTokenizer::FromJson(good.dump()).ok());
}

// -------------------------------------------------------------- loader ----

class TokenizerLoaderTest : public ::testing::Test {
 protected:
  std::string Dir(const std::string& name) {
    const std::string dir = ::testing::TempDir() + "/tokenizer_loader_" + name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  static std::string Config(int vocab_size) {
    engine::ModelConfig c;
    c.architecture = "LlamaForCausalLM";
    c.vocab_size = vocab_size;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_layers = 1;
    c.num_heads = 4;
    c.num_kv_heads = 4;
    c.head_dim = 16;
    c.max_position_embeddings = 128;
    return c.ToJson();
  }
};

TEST_F(TokenizerLoaderTest, PrefersTokenizerJson) {
  const std::string dir = Dir("bpe");
  Fixture f;
  f.merges = {{"a", "b"}};
  Write(dir + "/tokenizer.json", f.ToJson());
  Write(dir + "/tokenizer_config.json", R"({"eos_token": "ab"})");
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("ab"), ElementsAre(256));
  EXPECT_EQ((*tok)->eos_token_id(), 256);  // ASCII spells the same in the byte-level alphabet
}

TEST_F(TokenizerLoaderTest, TokenizerMustFitTheModelVocabulary) {
  const std::string dir = Dir("too_big");
  Fixture f;
  f.merges = {{"a", "b"}};
  Write(dir + "/tokenizer.json", f.ToJson());
  Write(dir + "/config.json", Config(256));
  auto tok = LoadTokenizer(dir);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  Write(dir + "/config.json", Config(300));
  EXPECT_TRUE(LoadTokenizer(dir).ok());
}

TEST_F(TokenizerLoaderTest, FallsBackToBytesOrFails) {
  const std::string dir = Dir("bytes");
  Write(dir + "/config.json", Config(300));
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 300);
  EXPECT_THAT((*tok)->Encode("hi"), ElementsAre('h', 'i'));

  Write(dir + "/config.json", Config(100));
  tok = LoadTokenizer(dir);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kFailedPrecondition);

  const std::string broken = Dir("broken");
  Write(broken + "/tokenizer.json", "{\"model\": 5}");
  tok = LoadTokenizer(broken);
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("tokenizer.json"));
  EXPECT_FALSE(LoadTokenizer(Dir("empty")).ok());
}

}  // namespace
}  // namespace pdserve::text
