// Unit tests for BPE over text vocabularies, as SentencePiece-converted
// tokenizer.json files have them (Llama 2, Mistral 7B v0.1): the Prepend /
// Replace normalizer, the Metaspace pre-tokenizer (prepend_scheme first /
// always / never, split), byte_fallback, unk_token with and without
// fuse_unk, ignore_merges, and decoding through the decoder chain (whole
// texts and streams), on small hand-written fixtures. The real Llama 2 file
// is checked in tests/tokenizer_reference.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/bpe_tokenizer.h"
#include "text/pretokenizer.h"

namespace pdserve::text {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using Json = nlohmann::ordered_json;

const std::string kMeta = "\u2581";  // ▁

std::string M(std::string_view s) { return kMeta + std::string(s); }

Json Llama2Normalizer() {
  return {
      {"type", "Sequence"},
      {"normalizers",
       Json::array({{{"type", "Prepend"}, {"prepend", kMeta}},
                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}})}};
}

Json Llama2Decoder() {
  return {{"type", "Sequence"},
          {"decoders",
           Json::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                        {{"type", "ByteFallback"}},
                        {{"type", "Fuse"}},
                        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
}

Json Metaspace(const std::string& scheme, bool split) {
  return {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", scheme}, {"split", split}};
}

// A Llama 2-like tokenizer.json: 0 <unk>, 1 <s>, 2 </s> (special added
// tokens), 3..258 <0x00>..<0xFF> (the bytes in `missing_bytes` left out),
// then one token per character of `chars`, then each merge's result.
struct Fixture {
  std::string chars = "\u2581abcdehlorwHT!";
  std::vector<std::pair<std::string, std::string>> merges = {
      {kMeta, "a"}, {"l", "l"},  {"H", "e"},     {"He", "ll"}, {"Hell", "o"},    {kMeta, "Hello"},
      {"o", "r"},   {"w", "or"}, {kMeta, "wor"}, {"l", "d"},   {M("wor"), "ld"}, {kMeta, kMeta}};
  std::vector<std::string> extra_vocab;  // tokens no merge makes
  std::vector<int> missing_bytes;
  Json normalizer = Llama2Normalizer();
  Json pre_tokenizer = nullptr;
  Json decoder = Llama2Decoder();
  Json added_tokens = Json::array();
  bool byte_fallback = true;
  bool fuse_unk = true;
  bool ignore_merges = false;

  std::string ToJson() const {
    Json vocab = Json::object();
    vocab["<unk>"] = 0;
    vocab["<s>"] = 1;
    vocab["</s>"] = 2;
    for (int b = 0; b < 256; ++b) {
      if (std::find(missing_bytes.begin(), missing_bytes.end(), b) != missing_bytes.end()) continue;
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      vocab[name] = 3 + b;
    }
    int next = 259;
    for (size_t i = 0; i < chars.size();) {
      size_t n = 1;
      while (i + n < chars.size() && (static_cast<uint8_t>(chars[i + n]) & 0xC0) == 0x80) ++n;
      vocab[chars.substr(i, n)] = next++;
      i += n;
    }
    Json merge_list = Json::array();
    for (const auto& [a, b] : merges) {
      if (!vocab.contains(a + b)) vocab[a + b] = next++;
      merge_list.push_back(a + " " + b);
    }
    for (const std::string& t : extra_vocab) vocab[t] = next++;
    Json added = added_tokens;
    for (const auto& [content, id] : {std::pair{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}}) {
      added.push_back({{"id", id},
                       {"content", content},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
    Json root = {{"version", "1.0"},
                 {"added_tokens", added},
                 {"normalizer", normalizer},
                 {"pre_tokenizer", pre_tokenizer},
                 {"post_processor", nullptr},
                 {"decoder", decoder},
                 {"model",
                  {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", "<unk>"},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", fuse_unk},
                   {"byte_fallback", byte_fallback},
                   {"ignore_merges", ignore_merges},
                   {"vocab", vocab},
                   {"merges", merge_list}}}};
    return root.dump();
  }
};

class SentencePieceBpeTest : public ::testing::Test {
 protected:
  void Load(const Fixture& f) {
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> t = BpeTokenizer::FromJson(f.ToJson());
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = *std::move(t);
  }
  int32_t Id(const std::string& token) const {
    std::optional<int32_t> id = tok_->TokenId(token);
    EXPECT_TRUE(id.has_value()) << token;
    return id.value_or(-1);
  }
  static int32_t Byte(int b) { return 3 + b; }
  std::string Stream(const std::vector<int32_t>& ids, bool skip_special = true) const {
    IncrementalDetokenizer detok(*tok_, skip_special);
    std::string out;
    for (int32_t id : ids) out += detok.Push(id);
    return out + detok.Flush();
  }

  std::unique_ptr<BpeTokenizer> tok_;
};

TEST_F(SentencePieceBpeTest, LegacyNormalizerPrependsAndReplacesSpaces) {
  Load(Fixture());
  EXPECT_THAT(tok_->Encode("Hello world"), ElementsAre(Id(M("Hello")), Id(M("world"))));
  EXPECT_THAT(tok_->Encode("a"), ElementsAre(Id(M("a"))));
  // A leading space gives "▁▁Hello": the pair "▁ ▁" ranks after "▁ Hello".
  EXPECT_THAT(tok_->Encode(" Hello"), ElementsAre(Id(kMeta), Id(M("Hello"))));
  EXPECT_THAT(tok_->Encode("Hello  "), ElementsAre(Id(M("Hello")), Id(M(kMeta))));
  EXPECT_THAT(tok_->Encode(""), ElementsAre());
}

TEST_F(SentencePieceBpeTest, AddedTokensSplitBeforeTheNormalizer) {
  Load(Fixture());
  // Every piece between added tokens gets its own "▁" (the legacy Llama 2
  // behaviour).
  EXPECT_THAT(tok_->Encode("<s>Hello</s>a"), ElementsAre(1, Id(M("Hello")), 2, Id(M("a"))));
  EXPECT_THAT(tok_->Encode("<s> Hello"), ElementsAre(1, Id(kMeta), Id(M("Hello"))));
  // Specials as plain text: "<" and ">" are bytes here.
  EXPECT_THAT(tok_->EncodeOrdinary("<s>"), ElementsAre(Id(kMeta), Byte('<'), Byte('s'), Byte('>')));
}

TEST_F(SentencePieceBpeTest, ByteFallbackForCharactersOutsideTheVocabulary) {
  Load(Fixture());
  // "é" (C3 A9) and "你" (E4 BD A0) are not in the vocabulary.
  const std::vector<int32_t> ids = tok_->Encode("Hello caf\xC3\xA9 \xE4\xBD\xA0!");
  EXPECT_THAT(ids, ElementsAre(Id(M("Hello")), Id(kMeta), Id("c"), Id("a"), Byte('f'), Byte(0xC3),
                               Byte(0xA9), Id(kMeta), Byte(0xE4), Byte(0xBD), Byte(0xA0), Id("!")));
  EXPECT_EQ(tok_->Decode(ids), "Hello caf\xC3\xA9 \xE4\xBD\xA0!");
  // Streaming holds the bytes of an incomplete character back.
  IncrementalDetokenizer detok(*tok_);
  EXPECT_EQ(detok.Push(Byte(0xE4)), "");
  EXPECT_EQ(detok.Push(Byte(0xBD)), "");
  EXPECT_EQ(detok.Push(Byte(0xA0)), "\xE4\xBD\xA0");
  // Bytes that never complete a character become U+FFFD, in Decode and in
  // streams alike.
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{Id(M("a")), Byte(0xE4), Id("b")}),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(Stream({Id(M("a")), Byte(0xE4), Id("b")}),
            " a\xEF\xBF\xBD"
            "b");
}

TEST_F(SentencePieceBpeTest, UnkWhenByteFallbackCannotSpellTheCharacter) {
  Fixture f;
  f.missing_bytes = {0xA9};
  Load(f);
  // "é" needs <0xA9>: the character becomes <unk>; "ü" (C3 BC) still falls back.
  EXPECT_THAT(tok_->Encode("\xC3\xA9\xC3\xBC"), ElementsAre(Id(kMeta), 0, Byte(0xC3), Byte(0xBC)));
  // Consecutive unknown characters fuse into one <unk> with fuse_unk ...
  EXPECT_THAT(tok_->Encode("a\xC3\xA9\xC3\xA9"
                           "b"),
              ElementsAre(Id(M("a")), 0, Id("b")));
  // ... and stay one each without.
  f.fuse_unk = false;
  Load(f);
  EXPECT_THAT(tok_->Encode("a\xC3\xA9\xC3\xA9"
                           "b"),
              ElementsAre(Id(M("a")), 0, 0, Id("b")));
  // Without byte_fallback every unknown character is <unk>.
  f.byte_fallback = false;
  f.fuse_unk = true;
  f.missing_bytes.clear();
  Load(f);
  EXPECT_THAT(tok_->Encode("\xE4\xBD\xA0\xC3\xA9!"), ElementsAre(Id(kMeta), 0, Id("!")));
  // <unk> is special: skipped in decoding unless asked for.
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{Id(M("a")), 0, Id("b")}), "ab");
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{Id(M("a")), 0, Id("b")}, false), "a<unk>b");
  // Without ByteFallback in the decoder, byte tokens decode to their names.
  f.decoder = {
      {"type", "Sequence"},
      {"decoders",
       Json::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                    {{"type", "Fuse"}}})}};
  Load(f);
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{Byte(0x41)}), "<0x41>");
}

TEST_F(SentencePieceBpeTest, DecodeDropsTheLeadingSpaceAStreamKeeps) {
  Load(Fixture());
  const std::vector<int32_t> ids = tok_->Encode("Hello world!");
  EXPECT_EQ(tok_->Decode(ids), "Hello world!");
  // A stream continues earlier text: its first word keeps its space.
  EXPECT_EQ(Stream(ids), " Hello world!");
  EXPECT_EQ(tok_->TokenBytes(Id(M("Hello"))), " Hello");
  // After BOS, kept as text, the space stays in Decode too (the fused text
  // starts with "<s>").
  std::vector<int32_t> with_bos = {1};
  with_bos.insert(with_bos.end(), ids.begin(), ids.end());
  EXPECT_EQ(tok_->Decode(with_bos, /*skip_special_tokens=*/false), "<s> Hello world!");
  EXPECT_EQ(Stream(with_bos, false), "<s> Hello world!");
  EXPECT_EQ(tok_->Decode(with_bos), "Hello world!");  // BOS skipped: first word first
  EXPECT_EQ(tok_->SpecialTokenText(1), "<s>");
  // Only one space goes (Strip start = 1).
  EXPECT_EQ(tok_->Decode(tok_->Encode("  a")), "  a");
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{}), "");
}

TEST_F(SentencePieceBpeTest, MetaspaceFirstPrependsOnlyAtTheStartOfTheText) {
  // The non-legacy conversion: no normalizer, Metaspace(prepend_scheme first,
  // split false).
  Fixture f;
  f.normalizer = nullptr;
  f.pre_tokenizer = Metaspace("first", false);
  Load(f);
  EXPECT_THAT(tok_->Encode("Hello world"), ElementsAre(Id(M("Hello")), Id(M("world"))));
  // Text after an added token gets no "▁" ...
  EXPECT_THAT(tok_->Encode("<s>Hello"), ElementsAre(1, Id("Hello")));
  EXPECT_THAT(tok_->Encode("a<s>Hello"), ElementsAre(Id(M("a")), 1, Id("Hello")));
  // ... unless it brings a space of its own; a leading "▁" is not doubled.
  EXPECT_THAT(tok_->Encode("<s> Hello"), ElementsAre(1, Id(M("Hello"))));
  EXPECT_THAT(tok_->Encode(M("a")), ElementsAre(Id(M("a"))));
  // split false: one word, so "▁▁" can form across a double space.
  EXPECT_THAT(tok_->Encode("a  b"), ElementsAre(Id(M("a")), Id(M(kMeta)), Id("b")));
}

TEST_F(SentencePieceBpeTest, MetaspaceAlwaysNeverAndSplit) {
  Fixture f;
  f.normalizer = nullptr;
  f.pre_tokenizer = Metaspace("always", true);
  f.decoder = {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}};
  Load(f);
  EXPECT_THAT(tok_->Encode("<s>Hello"), ElementsAre(1, Id(M("Hello"))));
  // split: every "▁" starts a word, so "▁▁" never forms.
  EXPECT_THAT(tok_->Encode("a  b"), ElementsAre(Id(M("a")), Id(kMeta), Id(kMeta), Id("b")));
  // The Metaspace decoder drops the first token's "▁" only.
  EXPECT_EQ(tok_->Decode(tok_->Encode("Hello world")), "Hello world");
  EXPECT_EQ(Stream(tok_->Encode("Hello world")), " Hello world");

  f.pre_tokenizer = Metaspace("never", true);
  Load(f);
  EXPECT_THAT(tok_->Encode("Hello world"), ElementsAre(Id("Hello"), Id(M("world"))));
  // Older files: add_prefix_space instead of prepend_scheme.
  f.pre_tokenizer = {{"type", "Metaspace"}, {"replacement", kMeta}, {"add_prefix_space", true}};
  Load(f);
  EXPECT_THAT(tok_->Encode("<s>a"), ElementsAre(1, Id(M("a"))));  // "always"
  f.pre_tokenizer = {{"type", "Metaspace"}, {"replacement", kMeta}, {"add_prefix_space", false}};
  Load(f);
  EXPECT_THAT(tok_->Encode("a"), ElementsAre(Id("a")));  // "never"
}

TEST_F(SentencePieceBpeTest, IgnoreMergesTakesWholeWords) {
  // "▁Hel" is in the vocabulary, but no merge makes it.
  Fixture f;
  f.normalizer = nullptr;
  f.pre_tokenizer = Metaspace("always", true);
  f.extra_vocab = {M("Hel")};
  Load(f);
  EXPECT_THAT(tok_->Encode("Hel"), ElementsAre(Id(kMeta), Id("He"), Id("l")));
  f.ignore_merges = true;
  Load(f);
  EXPECT_THAT(tok_->Encode("Hel Hello"), ElementsAre(Id(M("Hel")), Id(M("Hello"))));
}

TEST(MetaspacePreTokenizerTest, SplitsLikeTheRustLibrary) {
  auto make = [](PrependScheme scheme, bool split) {
    absl::StatusOr<PreTokenizer> p = PreTokenizer::Create({MetaspaceStep{kMeta, scheme, split}});
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  };
  const PreTokenizer always = make(PrependScheme::kAlways, true);
  EXPECT_THAT(always.Split("Hey friend!"), ElementsAre(M("Hey"), M("friend!")));
  EXPECT_THAT(always.Split("Hey   friend!"), ElementsAre(M("Hey"), kMeta, kMeta, M("friend!")));
  EXPECT_THAT(always.Split("x", /*starts_text=*/false), ElementsAre(M("x")));
  EXPECT_THAT(always.Split(" x"), ElementsAre(M("x")));             // already starts with "▁"
  EXPECT_THAT(always.Split("a\tb\nc"), ElementsAre(M("a\tb\nc")));  // only U+0020 is a space
  const PreTokenizer first = make(PrependScheme::kFirst, false);
  EXPECT_THAT(first.Split("a b"), ElementsAre(M("a") + M("b")));
  EXPECT_THAT(first.Split("a b", /*starts_text=*/false), ElementsAre("a" + M("b")));
  const PreTokenizer never = make(PrependScheme::kNever, true);
  EXPECT_THAT(never.Split("a b"), ElementsAre("a", M("b")));
  EXPECT_THAT(never.Split(""), ElementsAre());
  // Another replacement character.
  absl::StatusOr<PreTokenizer> underscore =
      PreTokenizer::Create({MetaspaceStep{"_", PrependScheme::kAlways, true}});
  ASSERT_TRUE(underscore.ok());
  EXPECT_THAT(underscore->Split("a b"), ElementsAre("_a", "_b"));
  EXPECT_FALSE(PreTokenizer::Create({MetaspaceStep{"ab", PrependScheme::kAlways, true}}).ok());
  EXPECT_FALSE(PreTokenizer::Create({MetaspaceStep{"", PrependScheme::kAlways, true}}).ok());
}

TEST(MetaspacePreTokenizerTest, FirstMeansTheFirstPieceOfAnEarlierSplit) {
  // A Split step before Metaspace: only its first piece starts the text.
  absl::StatusOr<std::unique_ptr<RegexSplitter>> comma = RegexSplitter::Create(",", true);
  ASSERT_TRUE(comma.ok());
  absl::StatusOr<PreTokenizer> p = PreTokenizer::Create(
      {SplitStep{std::shared_ptr<const RegexSplitter>(*std::move(comma)), SplitBehavior::kRemoved},
       MetaspaceStep{kMeta, PrependScheme::kFirst, false}});
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(p->Split("a,b,c"), ElementsAre(M("a"), "b", "c"));
  EXPECT_THAT(p->Split(",a"), ElementsAre("a"));  // the first piece is not at offset 0
}

}  // namespace
}  // namespace pdserve::text
