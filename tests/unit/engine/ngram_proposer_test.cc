// NgramLookup: the longest suffix match wins, the most recent occurrence is
// used, a loop is proposed through its period, nothing without a match.
#include "engine/spec/ngram_proposer.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::engine::spec {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(NgramLookupTest, ProposesWhatFollowedTheMostRecentMatch) {
  //                              0  1  2  3  4  5  6  7  8  9
  const std::vector<int32_t> t = {5, 6, 7, 1, 5, 6, 8, 2, 9, 5, 6};
  // Suffix (5, 6): most recent earlier occurrence at 4 -> 8, 2, 9.
  EXPECT_THAT(NgramLookup(t, 2, 3, 3), ElementsAre(8, 2, 9));
  EXPECT_THAT(NgramLookup(t, 2, 3, 1), ElementsAre(8));
}

TEST(NgramLookupTest, LongestMatchFirst) {
  //                              0  1  2  3  4  5  6  7  8
  const std::vector<int32_t> t = {4, 5, 6, 1, 9, 5, 6, 2, 4, 5, 6};
  // (5, 6) last occurred at 5 -> 2, but (4, 5, 6) occurred at 0 -> 1.
  EXPECT_THAT(NgramLookup(t, 2, 3, 2), ElementsAre(1, 9));
  EXPECT_THAT(NgramLookup(t, 2, 2, 2), ElementsAre(2, 4));
}

TEST(NgramLookupTest, LoopsAreProposedThroughTheirPeriod) {
  const std::vector<int32_t> t = {3, 7, 1, 2, 7, 1, 2};
  EXPECT_THAT(NgramLookup(t, 2, 2, 5), ElementsAre(7, 1, 2, 7, 1));
  const std::vector<int32_t> same = {4, 4, 4};
  EXPECT_THAT(NgramLookup(same, 1, 2, 4), ElementsAre(4, 4, 4, 4));
}

TEST(NgramLookupTest, NothingWithoutAMatch) {
  EXPECT_THAT(NgramLookup(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 4), IsEmpty());
  EXPECT_THAT(NgramLookup(std::vector<int32_t>{1, 2, 3, 1}, 2, 3, 4), IsEmpty());
  EXPECT_THAT(NgramLookup(std::vector<int32_t>{1}, 1, 3, 4), IsEmpty());
}

TEST(NgramProposerTest, OneProposalPerRequest) {
  NgramProposer proposer({.min_n = 1, .max_n = 2});
  const std::vector<int32_t> a = {1, 2, 1}, b = {3, 4, 5};
  std::vector<ProposalRequest> reqs = {{.id = 1, .tokens = a, .max_tokens = 2},
                                       {.id = 2, .tokens = b, .max_tokens = 2}};
  std::vector<Proposal> out;
  ASSERT_TRUE(proposer.Propose(reqs, out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_THAT(out[0].tokens, ElementsAre(2, 1));
  EXPECT_THAT(out[0].probs, IsEmpty());
  EXPECT_THAT(out[1].tokens, IsEmpty());
}

}  // namespace
}  // namespace pdserve::engine::spec
