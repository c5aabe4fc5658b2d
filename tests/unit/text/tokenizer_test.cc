// Unit tests for text/tokenizer: byte round trips through the incremental
// detokenizer, held-back partial characters, U+FFFD for invalid input (output
// always valid UTF-8), special tokens and Flush.
#include "text/tokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::text {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// Strict UTF-8 check (RFC 3629): no overlongs, surrogates or > U+10FFFF.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char b = c(i);
    int len;
    uint32_t cp;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      if ((c(i + k) & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c(i + k) & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// Pushes every token, collecting deltas; each delta must be valid UTF-8.
std::string Detokenize(const Tokenizer& tok, const std::vector<int32_t>& ids, bool flush = true) {
  IncrementalDetokenizer detok(tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string delta = detok.Push(id);
    EXPECT_TRUE(IsValidUtf8(delta)) << "invalid delta after token " << id;
    out += delta;
  }
  if (flush) {
    const std::string tail = detok.Flush();
    EXPECT_TRUE(IsValidUtf8(tail));
    out += tail;
  }
  return out;
}

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

TEST(TokenizerTest, ValidatorSelfCheck) {
  EXPECT_TRUE(IsValidUtf8("abc \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xE2\x82"));
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

TEST(TokenizerTest, ByteTokenizerBasics) {
  ByteTokenizer tok(260);
  EXPECT_EQ(tok.vocab_size(), 260);
  EXPECT_EQ(tok.Encode("A\xFF"), (std::vector<int32_t>{65, 255}));
  EXPECT_TRUE(tok.Encode("").empty());
  EXPECT_EQ(tok.TokenBytes(65), "A");
  EXPECT_EQ(tok.TokenBytes(255), "\xFF");
  EXPECT_EQ(tok.TokenBytes(0), std::string(1, '\0'));
  EXPECT_EQ(tok.TokenBytes(256), "");  // special
  EXPECT_EQ(tok.TokenBytes(259), "");
  EXPECT_EQ(tok.TokenBytes(260), "");  // out of range
  EXPECT_EQ(tok.TokenBytes(-1), "");
}

TEST(TokenizerTest, RoundTripsUtf8Text) {
  ByteTokenizer tok(258);
  const std::vector<std::string> texts = {
      "",
      "Hello, world!\n\ttabs and spaces",
      "caf\xC3\xA9 na\xC3\xAFve \xC3\x9F",                             // 2-byte
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",  // 你好，世界
      "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",              // emoji + modifier
      "\xF0\x90\x8D\x88 \xF4\x8F\xBF\xBF \xEF\xBF\xBF \xE0\xA0\x80 \xED\x9F\xBF",  // edges
      std::string("nul\0inside", 10),
  };
  for (const std::string& text : texts) {
    ASSERT_TRUE(IsValidUtf8(text));
    EXPECT_EQ(Detokenize(tok, tok.Encode(text)), text);
  }
}

TEST(TokenizerTest, SplitCharactersAreHeldBack) {
  ByteTokenizer tok(256);
  IncrementalDetokenizer detok(tok);
  // U+1F600: F0 9F 98 80.
  EXPECT_EQ(detok.Push(0xF0), "");
  EXPECT_EQ(detok.Push(0x9F), "");
  EXPECT_EQ(detok.Push(0x98), "");
  EXPECT_EQ(detok.Push(0x80), "\xF0\x9F\x98\x80");
  // ASCII then the first byte of U+20AC (E2 82 AC).
  EXPECT_EQ(detok.Push('a'), "a");
  EXPECT_EQ(detok.Push(0xE2), "");
  EXPECT_EQ(detok.Push(0x82), "");
  EXPECT_EQ(detok.Push(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(detok.Flush(), "");
}

// A multi-byte token tokenizer: exercises tokens that end mid-character and
// tokens that complete one character and start another.
class ChunkTokenizer final : public Tokenizer {
 public:
  explicit ChunkTokenizer(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  std::vector<int32_t> Encode(std::string_view) const override { return {}; }
  std::string TokenBytes(int32_t t) const override {
    return t >= 0 && t < static_cast<int32_t>(pieces_.size()) ? pieces_[t] : "";
  }
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }

 private:
  std::vector<std::string> pieces_;
};

TEST(TokenizerTest, TokensSpanningCharacters) {
  // "é€😀" = C3 A9 | E2 82 AC | F0 9F 98 80, cut at odd places.
  ChunkTokenizer tok({"x\xC3", "\xA9\xE2", "\x82", "\xAC\xF0\x9F", "\x98\x80!", ""});
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.Push(0), "x");
  EXPECT_EQ(detok.Push(1), "\xC3\xA9");
  EXPECT_EQ(detok.Push(5), "");  // special token mid-character: nothing, nothing lost
  EXPECT_EQ(detok.Push(2), "");
  EXPECT_EQ(detok.Push(3), "\xE2\x82\xAC");
  EXPECT_EQ(detok.Push(4), "\xF0\x9F\x98\x80!");
}

TEST(TokenizerTest, RandomSplitsRoundTrip) {
  const std::string text =
      "Mixed: abc \xC3\xA9\xE4\xB8\x96\xF0\x9F\x98\x80 \xE2\x82\xAC\xF0\x9F\x91\x8D end";
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> pieces;
    size_t i = 0;
    while (i < text.size()) {
      const size_t len = 1 + rng() % 5;
      pieces.push_back(text.substr(i, len));
      i += len;
    }
    ChunkTokenizer tok(pieces);
    std::vector<int32_t> ids(pieces.size());
    for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int32_t>(k);
    ASSERT_EQ(Detokenize(tok, ids), text) << "trial " << trial;
  }
}

TEST(TokenizerTest, InvalidSequencesBecomeReplacement) {
  ByteTokenizer tok(256);
  const struct {
    std::string in;
    std::string out;
  } cases[] = {
      {"\xFF", kFffd},                   // never valid
      {"\x80", kFffd},                   // stray continuation
      {"a\xBF\x62", "a" + kFffd + "b"},  // stray continuation between letters
      {"\xC0\xAF", kFffd + kFffd},       // overlong '/'
      {"\xC1\xBF", kFffd + kFffd},
      {"\xE0\x80\xAF", kFffd + kFffd + kFffd},              // overlong 3-byte
      {"\xF0\x80\x80\xAF", kFffd + kFffd + kFffd + kFffd},  // overlong 4-byte
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},              // surrogate U+D800
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // U+110000
      {"\xF5\x80", kFffd + kFffd},
      {"\xE2\x82\x41", kFffd + "A"},                         // truncated then ASCII
      {"\xF0\x9F\x98\xE2\x82\xAC", kFffd + "\xE2\x82\xAC"},  // truncated then valid
      {"\xE2\x82", kFffd},                                   // truncated at the end (Flush)
      {"\xC3", kFffd},
  };
  for (const auto& c : cases) {
    const std::string got = Detokenize(tok, Bytes(c.in));
    EXPECT_EQ(got, c.out) << "input of " << c.in.size() << " bytes";
    EXPECT_TRUE(IsValidUtf8(got));
  }
}

TEST(TokenizerTest, InvalidBytesReportedAsSoonAsKnown) {
  ByteTokenizer tok(256);
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.Push(0xFF), kFffd);  // bad lead: at once
  EXPECT_EQ(detok.Push(0xE2), "");     // could still be valid
  EXPECT_EQ(detok.Push('A'), kFffd + "A");
  EXPECT_EQ(detok.Push(0xED), "");
  EXPECT_EQ(detok.Push(0xA0), kFffd + kFffd);  // surrogate known at the 2nd byte
  EXPECT_EQ(detok.Flush(), "");
}

TEST(TokenizerTest, SpecialTokensProduceNoText) {
  ByteTokenizer tok(300);
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.Push(256), "");
  EXPECT_EQ(detok.Push(299), "");
  EXPECT_EQ(detok.Push(1000), "");  // out of range
  EXPECT_EQ(detok.Push(-4), "");
  EXPECT_EQ(detok.Push('h'), "h");
  EXPECT_EQ(detok.Push(257), "");
  EXPECT_EQ(detok.Push('i'), "i");
  EXPECT_EQ(detok.Flush(), "");
}

TEST(TokenizerTest, FlushEmitsHeldBytesAsReplacementAndResets) {
  ByteTokenizer tok(256);
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.Flush(), "");
  EXPECT_EQ(detok.Push(0xF0), "");
  EXPECT_EQ(detok.Push(0x9F), "");
  EXPECT_EQ(detok.Flush(), kFffd);
  EXPECT_EQ(detok.Flush(), "");
  // Usable after a flush: nothing left over.
  EXPECT_EQ(detok.Push(0x98), kFffd);  // a continuation byte alone is invalid
  EXPECT_EQ(detok.Push('z'), "z");
}

TEST(TokenizerTest, RandomBytesAlwaysGiveValidUtf8) {
  ByteTokenizer tok(256);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 64);
    // Bias toward bytes that make multi-byte sequences.
    for (int32_t& id : ids)
      id = (rng() % 3 == 0) ? static_cast<int32_t>(rng() % 128)
                            : static_cast<int32_t>(0x80 + rng() % 128);
    const std::string out = Detokenize(tok, ids);
    ASSERT_TRUE(IsValidUtf8(out)) << "trial " << trial;
    // Valid inputs come back unchanged.
    std::string in;
    for (int32_t id : ids) in.push_back(static_cast<char>(id));
    if (IsValidUtf8(in)) {
      ASSERT_EQ(out, in);
    } else {
      ASSERT_NE(out.find(kFffd), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace pdserve::text
