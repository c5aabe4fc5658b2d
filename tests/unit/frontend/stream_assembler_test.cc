#include "frontend/stream_assembler.h"

#include "gtest/gtest.h"
#include "tests/unit/frontend/fake_orchestrator.h"

namespace pdserve::frontend {
namespace {

using testing::Bytes;

TEST(StreamAssemblerTest, KeepsTheHistoryAndWholeCharacters) {
  text::ByteTokenizer tokenizer(300);
  StreamAssembler a(tokenizer, {});
  StreamAssembler::Piece p = a.Push(std::vector<int32_t>{'o', 0xE2, 0x98});
  EXPECT_EQ(p.num_tokens, 3u);
  EXPECT_EQ(p.text, "o");  // the snowman is not complete yet
  p = a.Push(std::vector<int32_t>{0x83, 256});
  EXPECT_EQ(p.text, "☃");  // special tokens add no text
  p = a.Push(std::vector<int32_t>{0xC3});
  EXPECT_EQ(p.text, "");
  EXPECT_EQ(a.Flush().text, "\xEF\xBF\xBD");  // an unfinished character becomes U+FFFD
  EXPECT_EQ(a.generated(), std::vector<int32_t>({'o', 0xE2, 0x98, 0x83, 256, 0xC3}));
}

TEST(StreamAssemblerTest, StopsAtTheTokenCompletingAStopString) {
  text::ByteTokenizer tokenizer(300);
  StreamAssembler a(tokenizer, {"<end>"});
  StreamAssembler::Piece p = a.Push(Bytes("hi <e"));
  EXPECT_EQ(p.text, "hi ");  // "<e" may begin the stop string
  EXPECT_FALSE(p.stopped);
  p = a.Push(Bytes("nd>tail"));
  EXPECT_TRUE(p.stopped);
  EXPECT_EQ(p.matched_stop, "<end>");
  EXPECT_EQ(p.num_tokens, 3u);  // 'n', 'd', '>'
  EXPECT_EQ(p.text, "");
  EXPECT_TRUE(a.stopped());
  EXPECT_EQ(a.Push(Bytes("more")).num_tokens, 0u);
  EXPECT_EQ(a.Flush().text, "");
  EXPECT_EQ(a.generated(), Bytes("hi <end>"));
}

TEST(StreamAssemblerTest, TheEndReleasesHeldTextOrCompletesAStop) {
  text::ByteTokenizer tokenizer(300);
  StreamAssembler held(tokenizer, {"abc"});
  EXPECT_EQ(held.Push(Bytes("xab")).text, "x");
  StreamAssembler::Piece end = held.Flush();
  EXPECT_EQ(end.text, "ab");
  EXPECT_FALSE(end.stopped);

  // The replacement character of an unfinished byte completes a stop string.
  StreamAssembler flushed(tokenizer, {"\xEF\xBF\xBD"});
  EXPECT_EQ(flushed.Push(std::vector<int32_t>{'q', 0xC3}).text, "q");
  end = flushed.Flush();
  EXPECT_TRUE(end.stopped);
  EXPECT_EQ(end.text, "");
}

}  // namespace
}  // namespace pdserve::frontend
