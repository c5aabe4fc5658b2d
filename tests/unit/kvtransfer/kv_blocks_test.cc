// Token-row addressing in paged KV regions: runs over block tables and the
// row spans every transport gathers from or scatters to. No sockets.
#include "kvtransfer/kv_blocks.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace pdserve::kvtransfer {
namespace {

using testing::HostKv;
using testing::SmallSpec;

TEST(KvBlocksTest, RunsSplitAtBlockBoundaries) {
  const std::vector<int32_t> table = {7, 2, 9, 4};
  // Tokens [3, 11) at 4 tokens per block: slot 3 of block 7, block 2, 2 of block 9.
  const std::vector<KvRun> runs = RunsOf(table, 4, 3, 8);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].block, 7);
  EXPECT_EQ(runs[0].slot, 3);
  EXPECT_EQ(runs[0].num_tokens, 1);
  EXPECT_EQ(runs[0].offset, 0);
  EXPECT_EQ(runs[1].block, 2);
  EXPECT_EQ(runs[1].slot, 0);
  EXPECT_EQ(runs[1].num_tokens, 4);
  EXPECT_EQ(runs[1].offset, 1);
  EXPECT_EQ(runs[2].block, 9);
  EXPECT_EQ(runs[2].num_tokens, 3);
  EXPECT_EQ(runs[2].offset, 5);
  EXPECT_THAT(BlocksCovering(table, 4, 3, 8), ::testing::ElementsAre(7, 2, 9));
  EXPECT_THAT(BlocksCovering(table, 4, 4, 4), ::testing::ElementsAre(2));
}

TEST(KvBlocksTest, CheckBlockTableNamesTheProblem) {
  HostKv kv(SmallSpec(1), 6, 4);
  const engine::KvRegion& r = kv.regions()[0];
  const std::vector<int32_t> ok = {5, 0, 3};
  EXPECT_TRUE(CheckBlockTable(r, ok, 12).ok());
  EXPECT_TRUE(CheckBlockTable(r, ok, 9).ok());
  EXPECT_THAT(std::string(CheckBlockTable(r, ok, 13).message()),
              ::testing::HasSubstr("does not cover 13 tokens"));
  const std::vector<int32_t> bad = {5, 6};
  EXPECT_THAT(std::string(CheckBlockTable(r, bad, 8).message()),
              ::testing::HasSubstr("block id 6 outside [0, 6)"));
}

TEST(KvBlocksTest, RowSpansRoundTripAcrossBlockLayouts) {
  const TransferSpec spec = SmallSpec(1, 13);
  HostKv a(spec, 10, 3, 1);
  HostKv b(spec, 10, 5, 2);
  const std::vector<int32_t> ta = a.Allocate(13);
  const std::vector<int32_t> tb = b.Allocate(13);
  const auto payload = testing::RandomLayers(spec, 3)[0];
  a.WriteLayer(0, ta, payload);
  EXPECT_TRUE(a.ReadLayer(0, ta, 13) == payload);
  b.WriteLayer(0, tb, a.ReadLayer(0, ta, 13));
  EXPECT_TRUE(b.ReadLayer(0, tb, 13) == payload);
  // K rows come first: the first span starts at K of token 0.
  std::vector<std::span<std::byte>> spans;
  AppendRowSpans(b.regions()[0], tb, 0, 13, &spans);
  EXPECT_EQ(spans.front().data(),
            b.regions()[0].k_base + int64_t{tb[0]} * b.regions()[0].block_stride_bytes);
  EXPECT_EQ(spans.size(), 6u);  // 3 runs of K, 3 of V
}

}  // namespace
}  // namespace pdserve::kvtransfer
