// Unit tests for text/decoder: every step of a tokenizer.json decoder chain
// (Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel), the Llama 2
// chain, and the difference between decoding a whole text and one token
// inside a stream.
#include "text/decoder.h"

#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "text/pretokenizer.h"

namespace pdserve::text {
namespace {

constexpr char kMeta[] = "\u2581";  // ▁

Decoder Make(std::vector<DecoderStep> steps) {
  absl::StatusOr<Decoder> d = Decoder::Create(std::move(steps));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : Decoder();
}

std::string DecodeAll(const Decoder& d, const std::vector<std::string>& tokens) {
  const std::vector<std::string_view> views(tokens.begin(), tokens.end());
  return d.Decode(views);
}

std::string M(std::string_view rest) { return std::string(kMeta) + std::string(rest); }

// Llama 2 / Mistral 7B v0.1: Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", 1, 0).
Decoder Llama2() {
  return Make(
      {ReplaceDecoder{kMeta, " "}, ByteFallbackDecoder{}, FuseDecoder{}, StripDecoder{" ", 1, 0}});
}

TEST(DecoderTest, EmptyChainJoinsTokens) {
  const Decoder d = Make({});
  EXPECT_EQ(DecodeAll(d, {"a", M("b"), "<0x41>"}), "a" + M("b") + "<0x41>");
  EXPECT_EQ(DecodeAll(d, {}), "");
}

TEST(DecoderTest, ReplaceActsOnEveryToken) {
  const Decoder d = Make({ReplaceDecoder{kMeta, " "}});
  EXPECT_EQ(DecodeAll(d, {M("Hello"), M(M("x")), "y"}), " Hello  xy");
  EXPECT_EQ(d.DecodeToken(M("the")), " the");
}

TEST(DecoderTest, ByteFallbackGroupsBytesAndKeepsThemRaw) {
  const Decoder d = Make({ByteFallbackDecoder{}});
  // "你" is E4 BD A0.
  EXPECT_EQ(DecodeAll(d, {"a", "<0xE4>", "<0xBD>", "<0xA0>", "b"}),
            "a\xE4\xBD\xA0"
            "b");
  EXPECT_EQ(DecodeAll(d, {"<0x0A>", "<0x41>"}), "\nA");
  EXPECT_EQ(DecodeAll(d, {"<0x0a>"}), "\n");  // lower-case hex, as the Rust library reads it
  // Not byte tokens: wrong length, no hex, not closed.
  EXPECT_EQ(DecodeAll(d, {"<0x4>", "<0xZZ>", "<0x41", "<0x414>"}), "<0x4><0xZZ><0x41<0x414>");
  // A lone byte of a multi-byte character stays a raw byte: a stream joins it
  // with the next ones (callers repair what stays incomplete).
  EXPECT_EQ(d.DecodeToken("<0xE4>"), "\xE4");
}

TEST(DecoderTest, StripCutsEachTokensEnds) {
  const Decoder d = Make({StripDecoder{" ", 1, 2}});
  EXPECT_EQ(DecodeAll(d, {"  a   ", " b", "c "}),
            " a "
            "b"
            "c");
  // Up to start / stop characters, only where they are the content.
  EXPECT_EQ(DecodeAll(Make({StripDecoder{"x", 2, 0}}), {"xxxa", "ax"}),
            "xa"
            "ax");
  // A token made only of the content character.
  EXPECT_EQ(DecodeAll(Make({StripDecoder{" ", 1, 1}}), {" ", "  "}), "");
  // Multi-byte content.
  EXPECT_EQ(DecodeAll(Make({StripDecoder{kMeta, 1, 1}}), {M(M("a"))}), M("a"));
}

TEST(DecoderTest, FuseThenStripCutsTheWholeText) {
  const Decoder d = Make({FuseDecoder{}, StripDecoder{" ", 1, 0}});
  EXPECT_EQ(DecodeAll(d, {" a", " b"}), "a b");
  // Without Fuse, Strip cuts every token.
  EXPECT_EQ(DecodeAll(Make({StripDecoder{" ", 1, 0}}), {" a", " b"}), "ab");
  // Inside a text, Strip after Fuse cuts nothing; Strip without Fuse still does.
  EXPECT_EQ(d.DecodeToken(" a"), " a");
  EXPECT_EQ(Make({StripDecoder{" ", 1, 0}}).DecodeToken(" a"), "a");
}

TEST(DecoderTest, MetaspaceDropsTheFirstTokensReplacementOnly) {
  const Decoder d = Make({MetaspaceDecoder{kMeta, true}});
  EXPECT_EQ(DecodeAll(d, {M("Hey"), M("friend!")}), "Hey friend!");
  // Every "▁" of the first token goes (the Rust library's rule), none of the others.
  EXPECT_EQ(DecodeAll(d, {M(M("a")), M(M("b"))}), "a  b");
  EXPECT_EQ(DecodeAll(d, {"<s>", M("Hey")}), "<s> Hey");
  // prepend_scheme never keeps it.
  EXPECT_EQ(DecodeAll(Make({MetaspaceDecoder{kMeta, false}}), {M("Hey")}), " Hey");
  // Inside a stream no token is first.
  EXPECT_EQ(d.DecodeToken(M("Hey")), " Hey");
  // Another replacement character.
  EXPECT_EQ(DecodeAll(Make({MetaspaceDecoder{"_", true}}), {"_a_b", "_c"}), "ab c");
}

TEST(DecoderTest, ByteLevelMapsTheAlphabetBack) {
  const Decoder d = Make({ByteLevelDecoder{}});
  EXPECT_EQ(DecodeAll(d, {ByteLevelAlphabet::Encode(" hi"), ByteLevelAlphabet::Encode("\xE4\xBD")}),
            " hi\xE4\xBD");
  // A token with a character outside the alphabet stays as it is.
  EXPECT_EQ(DecodeAll(d, {"<|eot_id|>", "\xC5\x84"}), "<|eot_id|>\xC5\x84");
}

TEST(DecoderTest, Llama2Chain) {
  const Decoder d = Llama2();
  EXPECT_EQ(DecodeAll(d, {M("Hello"), M("world")}), "Hello world");
  EXPECT_EQ(DecodeAll(d, {M(""), M("Hello")}), " Hello");  // one space is cut, not two
  EXPECT_EQ(DecodeAll(d, {"<s>", M("Hello")}), "<s> Hello");
  EXPECT_EQ(DecodeAll(d, {M("caf"), "<0xC3>", "<0xA9>", "!"}), "caf\xC3\xA9!");
  EXPECT_EQ(DecodeAll(d, {"<0x20>", "x"}), "x");  // the fused text starts with the byte's space
  // Tokens inside a stream keep their space; concatenated they give the
  // continuation of earlier text.
  EXPECT_EQ(d.DecodeToken(M("Hello")), " Hello");
  EXPECT_EQ(d.DecodeToken("<0x0A>"), "\n");
  EXPECT_EQ(d.DecodeToken("<s>"), "<s>");
}

TEST(DecoderTest, BadStepsAreErrors) {
  EXPECT_FALSE(Decoder::Create({ReplaceDecoder{"", " "}}).ok());
  EXPECT_FALSE(Decoder::Create({StripDecoder{"", 1, 0}}).ok());
  EXPECT_FALSE(Decoder::Create({StripDecoder{"ab", 1, 0}}).ok());
  EXPECT_FALSE(Decoder::Create({StripDecoder{" ", -1, 0}}).ok());
  EXPECT_FALSE(Decoder::Create({MetaspaceDecoder{"\xFF", true}}).ok());
  EXPECT_FALSE(Decoder::Create({MetaspaceDecoder{"ab", true}}).ok());
}

}  // namespace
}  // namespace pdserve::text
