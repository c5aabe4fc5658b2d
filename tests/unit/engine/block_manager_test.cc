// Unit tests for engine/kvcache/block_manager: allocation tables, exhaustion,
// growth, forking, and invariants after a long seeded random workload.
#include "engine/kvcache/block_manager.h"

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

using ::absl::StatusCode;

std::vector<int32_t> Table(const BlockManager& bm, SeqId seq) {
  auto t = bm.BlockTable(seq);
  return {t.begin(), t.end()};
}

// Checks that reference counts equal the number of tables holding each block,
// the free list is exactly the set of unreferenced blocks, with no duplicates.
void CheckInvariants(const BlockManager& bm, const std::vector<SeqId>& live) {
  std::vector<int> counted(bm.num_blocks(), 0);
  for (SeqId seq : live) {
    ASSERT_TRUE(bm.Contains(seq));
    std::set<int32_t> in_table;
    for (int32_t b : bm.BlockTable(seq)) {
      ASSERT_GE(b, 0);
      ASSERT_LT(b, bm.num_blocks());
      ASSERT_TRUE(in_table.insert(b).second) << "block " << b << " twice in seq " << seq;
      ++counted[b];
    }
    ASSERT_EQ(bm.Capacity(seq), static_cast<int>(in_table.size()) * bm.block_size());
  }
  ASSERT_EQ(bm.num_sequences(), live.size());
  int unreferenced = 0;
  for (int b = 0; b < bm.num_blocks(); ++b) {
    ASSERT_EQ(bm.RefCount(b), counted[b]) << "block " << b;
    if (counted[b] == 0) ++unreferenced;
  }
  // Free list disjoint from used blocks: its size equals the unreferenced
  // count, and allocating all of it yields only unreferenced, distinct ids.
  ASSERT_EQ(bm.num_free_blocks(), unreferenced);
  ASSERT_EQ(bm.num_used_blocks(), bm.num_blocks() - unreferenced);
}

TEST(BlockManagerTest, InitialState) {
  BlockManager bm(8, 16);
  EXPECT_EQ(bm.num_blocks(), 8);
  EXPECT_EQ(bm.block_size(), 16);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_EQ(bm.num_used_blocks(), 0);
  EXPECT_DOUBLE_EQ(bm.usage_ratio(), 0.0);
  EXPECT_EQ(bm.num_sequences(), 0u);
  EXPECT_DOUBLE_EQ(BlockManager(0, 16).usage_ratio(), 0.0);
}

TEST(BlockManagerTest, BlocksForTokens) {
  BlockManager bm(8, 16);
  const struct {
    int tokens;
    int blocks;
  } cases[] = {{0, 0}, {1, 1}, {15, 1}, {16, 1}, {17, 2}, {32, 2}, {33, 3}, {-5, 0}};
  for (const auto& c : cases) EXPECT_EQ(bm.BlocksForTokens(c.tokens), c.blocks) << c.tokens;
  EXPECT_TRUE(bm.CanAllocate(128));
  EXPECT_FALSE(bm.CanAllocate(129));
  EXPECT_FALSE(bm.CanAllocate(-1));
}

// One row: an operation and what must hold afterwards.
struct Step {
  enum Op { kAlloc, kReserve, kFork, kFree } op;
  SeqId a;
  int tokens_or_b;  // tokens for kAlloc/kReserve, dst seq for kFork
  StatusCode code;
  int free_after;
  std::vector<int32_t> table_a;  // BlockTable(a) afterwards
};

TEST(BlockManagerTest, TableDriven) {
  BlockManager bm(6, 4);
  const std::vector<Step> steps = {
      {Step::kAlloc, 1, 5, StatusCode::kOk, 4, {0, 1}},
      {Step::kAlloc, 2, 4, StatusCode::kOk, 3, {2}},
      {Step::kAlloc, 1, 1, StatusCode::kAlreadyExists, 3, {0, 1}},
      {Step::kAlloc, 3, 13, StatusCode::kResourceExhausted, 3, {}},
      {Step::kAlloc, 3, -1, StatusCode::kInvalidArgument, 3, {}},
      {Step::kReserve, 2, 4, StatusCode::kOk, 3, {2}},     // no growth needed
      {Step::kReserve, 2, 5, StatusCode::kOk, 2, {2, 3}},  // crosses a boundary
      {Step::kReserve, 2, 2, StatusCode::kOk, 2, {2, 3}},  // never shrinks
      {Step::kReserve, 2, 17, StatusCode::kResourceExhausted, 2, {2, 3}},
      {Step::kReserve, 2, -3, StatusCode::kInvalidArgument, 2, {2, 3}},
      {Step::kReserve, 9, 4, StatusCode::kNotFound, 2, {}},
      {Step::kFree, 1, 0, StatusCode::kOk, 4, {}},
      {Step::kAlloc, 4, 1, StatusCode::kOk, 3, {0}},  // stack: 0 comes back first
      {Step::kFree, 77, 0, StatusCode::kOk, 3, {}},   // unknown: no-op
      {Step::kAlloc, 5, 0, StatusCode::kOk, 3, {}},   // empty sequence is fine
      {Step::kReserve, 5, 12, StatusCode::kOk, 0, {1, 4, 5}},
      {Step::kAlloc, 6, 1, StatusCode::kResourceExhausted, 0, {}},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    absl::Status st;
    switch (s.op) {
      case Step::kAlloc:
        st = bm.Allocate(s.a, s.tokens_or_b);
        break;
      case Step::kReserve:
        st = bm.Reserve(s.a, s.tokens_or_b);
        break;
      case Step::kFork:
        st = bm.Fork(s.a, s.tokens_or_b);
        break;
      case Step::kFree:
        bm.Free(s.a);
        break;
    }
    EXPECT_EQ(st.code(), s.code) << "step " << i << ": " << st;
    EXPECT_EQ(bm.num_free_blocks(), s.free_after) << "step " << i;
    EXPECT_EQ(Table(bm, s.a), s.table_a) << "step " << i;
  }
}

TEST(BlockManagerTest, ExhaustionLeavesStateUnchangedAndNamesCounts) {
  BlockManager bm(4, 8);
  ASSERT_TRUE(bm.Allocate(1, 20).ok());  // 3 blocks
  const std::vector<int32_t> before = Table(bm, 1);
  absl::Status st = bm.Allocate(2, 9);  // needs 2, 1 free
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("needs 2 blocks"), std::string_view::npos) << st;
  EXPECT_NE(st.message().find("1 of 4 free"), std::string_view::npos) << st;
  EXPECT_FALSE(bm.Contains(2));
  EXPECT_EQ(bm.num_free_blocks(), 1);
  EXPECT_EQ(Table(bm, 1), before);

  st = bm.Reserve(1, 40);  // needs 2 more, 1 free
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Table(bm, 1), before);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  EXPECT_EQ(bm.Capacity(1), 24);
}

TEST(BlockManagerTest, ReserveGrowsAcrossBlockBoundaries) {
  BlockManager bm(10, 4);
  ASSERT_TRUE(bm.Allocate(7, 1).ok());
  for (int tokens = 1; tokens <= 40; ++tokens) {
    ASSERT_TRUE(bm.Reserve(7, tokens).ok()) << tokens;
    EXPECT_EQ(bm.Capacity(7), ((tokens + 3) / 4) * 4) << tokens;
    EXPECT_GE(bm.Capacity(7), tokens);
  }
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_DOUBLE_EQ(bm.usage_ratio(), 1.0);
  EXPECT_EQ(bm.Reserve(7, 41).code(), StatusCode::kResourceExhausted);
}

TEST(BlockManagerTest, ForkSharesBlocksAndFreesAfterBoth) {
  BlockManager bm(8, 4);
  ASSERT_TRUE(bm.Allocate(1, 8).ok());
  ASSERT_TRUE(bm.Fork(1, 2).ok());
  EXPECT_EQ(Table(bm, 2), Table(bm, 1));
  for (int32_t b : bm.BlockTable(1)) EXPECT_EQ(bm.RefCount(b), 2);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  EXPECT_EQ(bm.Fork(1, 2).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(bm.Fork(1, 1).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(bm.Fork(3, 4).code(), StatusCode::kNotFound);

  // The fork grows on its own; shared blocks stay shared.
  ASSERT_TRUE(bm.Reserve(2, 9).ok());
  EXPECT_EQ(bm.Capacity(2), 12);
  EXPECT_EQ(bm.Capacity(1), 8);
  EXPECT_EQ(bm.RefCount(bm.BlockTable(2)[2]), 1);

  const std::vector<int32_t> shared = Table(bm, 1);
  bm.Free(1);
  for (int32_t b : shared) EXPECT_EQ(bm.RefCount(b), 1);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  bm.Free(2);
  for (int32_t b : shared) EXPECT_EQ(bm.RefCount(b), 0);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_EQ(bm.num_sequences(), 0u);
}

TEST(BlockManagerTest, UsageRatio) {
  BlockManager bm(4, 2);
  ASSERT_TRUE(bm.Allocate(1, 2).ok());
  EXPECT_DOUBLE_EQ(bm.usage_ratio(), 0.25);
  ASSERT_TRUE(bm.Allocate(2, 3).ok());
  EXPECT_DOUBLE_EQ(bm.usage_ratio(), 0.75);
  ASSERT_TRUE(bm.Fork(2, 3).ok());
  EXPECT_DOUBLE_EQ(bm.usage_ratio(), 0.75);  // forks use no new blocks
  bm.Free(2);
  EXPECT_DOUBLE_EQ(bm.usage_ratio(), 0.75);
  bm.Free(3);
  EXPECT_DOUBLE_EQ(bm.usage_ratio(), 0.25);
}

TEST(BlockManagerTest, UnknownSequenceQueries) {
  BlockManager bm(4, 2);
  bm.Free(42);
  EXPECT_FALSE(bm.Contains(42));
  EXPECT_EQ(bm.Capacity(42), 0);
  EXPECT_TRUE(bm.BlockTable(42).empty());
  EXPECT_EQ(bm.num_free_blocks(), 4);
}

TEST(BlockManagerTest, RandomWorkloadKeepsInvariants) {
  BlockManager bm(64, 16);
  std::mt19937_64 rng(20240601);
  std::vector<SeqId> live;
  SeqId next_id = 1;
  for (int op = 0; op < 10000; ++op) {
    const int kind = static_cast<int>(rng() % 4);
    const int free_before = bm.num_free_blocks();
    if (kind == 0 || live.empty()) {
      const int tokens = static_cast<int>(rng() % 200);
      const SeqId seq = next_id++;
      absl::Status st = bm.Allocate(seq, tokens);
      if (st.ok()) {
        live.push_back(seq);
        ASSERT_GE(bm.Capacity(seq), tokens);
      } else {
        ASSERT_EQ(st.code(), StatusCode::kResourceExhausted);
        ASSERT_GT(bm.BlocksForTokens(tokens), free_before);
        ASSERT_EQ(bm.num_free_blocks(), free_before);
        ASSERT_FALSE(bm.Contains(seq));
      }
    } else {
      const size_t idx = rng() % live.size();
      const SeqId seq = live[idx];
      if (kind == 1) {
        const int tokens = bm.Capacity(seq) + static_cast<int>(rng() % 40);
        const auto before = Table(bm, seq);
        absl::Status st = bm.Reserve(seq, tokens);
        if (st.ok()) {
          ASSERT_GE(bm.Capacity(seq), tokens);
        } else {
          ASSERT_EQ(st.code(), StatusCode::kResourceExhausted);
          ASSERT_EQ(Table(bm, seq), before);
          ASSERT_EQ(bm.num_free_blocks(), free_before);
        }
      } else if (kind == 2) {
        const SeqId dst = next_id++;
        ASSERT_TRUE(bm.Fork(seq, dst).ok());
        ASSERT_EQ(Table(bm, dst), Table(bm, seq));
        ASSERT_EQ(bm.num_free_blocks(), free_before);
        live.push_back(dst);
      } else {
        bm.Free(seq);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(idx));
      }
    }
    if (op % 97 == 0) {
      ASSERT_NO_FATAL_FAILURE(CheckInvariants(bm, live));
    }
  }
  ASSERT_NO_FATAL_FAILURE(CheckInvariants(bm, live));
  // Free lists are disjoint from used blocks: handing out every free block
  // must yield only unreferenced, distinct ids.
  const int free_count = bm.num_free_blocks();
  const SeqId probe = next_id++;
  ASSERT_TRUE(bm.Allocate(probe, free_count * bm.block_size()).ok());
  std::set<int32_t> probe_blocks;
  for (int32_t b : bm.BlockTable(probe)) {
    ASSERT_EQ(bm.RefCount(b), 1) << "block " << b << " was free but referenced";
    probe_blocks.insert(b);
  }
  ASSERT_EQ(static_cast<int>(probe_blocks.size()), free_count);
  bm.Free(probe);
  for (SeqId seq : live) bm.Free(seq);
  EXPECT_EQ(bm.num_free_blocks(), bm.num_blocks());
  EXPECT_EQ(bm.num_sequences(), 0u);
  for (int b = 0; b < bm.num_blocks(); ++b) EXPECT_EQ(bm.RefCount(b), 0);
}

}  // namespace
}  // namespace pdserve::engine
