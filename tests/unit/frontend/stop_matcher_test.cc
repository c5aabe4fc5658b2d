#include "frontend/stop_matcher.h"

#include "gtest/gtest.h"

namespace pdserve::frontend {
namespace {

// Feeds `pieces` and returns what reached the client, and the match.
std::pair<std::string, std::string> RunStops(std::vector<std::string> stops,
                                             const std::vector<std::string>& pieces) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const std::string& p : pieces) {
    StopMatcher::Result r = m.Push(p);
    out += r.text;
    if (r.stopped) return {out, r.matched};
  }
  return {out + m.Flush(), ""};
}

TEST(StopMatcherTest, NoStopsPassesEverythingThrough) {
  EXPECT_EQ(RunStops({}, {"ab", "c"}), std::make_pair(std::string("abc"), std::string()));
}

TEST(StopMatcherTest, MatchAcrossPiecesIsNotLeaked) {
  EXPECT_EQ(RunStops({"STOP"}, {"hello S", "T", "OP and more"}),
            std::make_pair(std::string("hello "), std::string("STOP")));
  EXPECT_EQ(RunStops({"\n\n"}, {"a\n", "\nb"}),
            std::make_pair(std::string("a"), std::string("\n\n")));
}

TEST(StopMatcherTest, PartialPrefixIsReleasedWhenItCannotMatch) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("xST").text, "x");
  EXPECT_EQ(m.Push("A").text, "STA");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, EarliestMatchWinsThenLongest) {
  EXPECT_EQ(RunStops({"cd", "bc"}, {"abcdef"}).second, "bc");
  EXPECT_EQ(RunStops({"b", "bcd"}, {"abcd"}).second, "bcd");
  EXPECT_EQ(RunStops({"b", "bcd"}, {"abcd"}).first, "a");
}

TEST(StopMatcherTest, HeldTextIsFlushedAtTheEnd) {
  EXPECT_EQ(RunStops({"END"}, {"the E", "N"}),
            std::make_pair(std::string("the EN"), std::string()));
}

TEST(StopMatcherTest, MultiByteCharactersAreNeverSplit) {
  // "é" is C3 A9; a stop string starting with its first byte cannot cut it.
  StopMatcher m({"\xC3\xA9!"});
  StopMatcher::Result r = m.Push("a\xC3\xA9");
  EXPECT_EQ(r.text, "a");
  r = m.Push("?");
  EXPECT_EQ(r.text, "\xC3\xA9?");
}

TEST(StopMatcherTest, NothingAfterAStop) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.Push("ax").stopped);
  EXPECT_EQ(m.Push("more").text, "");
  EXPECT_EQ(m.Flush(), "");
}

}  // namespace
}  // namespace pdserve::frontend
