// Unit tests for engine/kvcache/kv_cache_manager: allocation tables, exhaustion,
// growth, forking, content hashes with shared and evictable blocks, and
// invariants after long seeded random workloads.
#include "engine/kvcache/kv_cache_manager.h"

#include <algorithm>
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

std::vector<int32_t> Table(const KvCacheManager& bm, SeqId seq) {
  auto t = bm.BlockTable(seq);
  return {t.begin(), t.end()};
}

// Checks that reference counts equal the number of tables holding each block,
// the free list is exactly the set of unreferenced blocks, with no duplicates.
void CheckInvariants(const KvCacheManager& bm, const std::vector<SeqId>& live) {
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

TEST(KvCacheManagerTest, InitialState) {
  KvCacheManager bm(8, 16);
  EXPECT_EQ(bm.num_blocks(), 8);
  EXPECT_EQ(bm.block_size(), 16);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_EQ(bm.num_used_blocks(), 0);
  EXPECT_DOUBLE_EQ(bm.usage_ratio(), 0.0);
  EXPECT_EQ(bm.num_sequences(), 0u);
  EXPECT_DOUBLE_EQ(KvCacheManager(0, 16).usage_ratio(), 0.0);
}

TEST(KvCacheManagerTest, BlocksForTokens) {
  KvCacheManager bm(8, 16);
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

TEST(KvCacheManagerTest, TableDriven) {
  KvCacheManager bm(6, 4);
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

TEST(KvCacheManagerTest, ExhaustionLeavesStateUnchangedAndNamesCounts) {
  KvCacheManager bm(4, 8);
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

TEST(KvCacheManagerTest, ReserveGrowsAcrossBlockBoundaries) {
  KvCacheManager bm(10, 4);
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

TEST(KvCacheManagerTest, ForkSharesBlocksAndFreesAfterBoth) {
  KvCacheManager bm(8, 4);
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

TEST(KvCacheManagerTest, UsageRatio) {
  KvCacheManager bm(4, 2);
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

TEST(KvCacheManagerTest, UnknownSequenceQueries) {
  KvCacheManager bm(4, 2);
  bm.Free(42);
  EXPECT_FALSE(bm.Contains(42));
  EXPECT_EQ(bm.Capacity(42), 0);
  EXPECT_TRUE(bm.BlockTable(42).empty());
  EXPECT_EQ(bm.num_free_blocks(), 4);
}

TEST(KvCacheManagerTest, RandomWorkloadKeepsInvariants) {
  KvCacheManager bm(64, 16);
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

TEST(KvCacheManagerTest, BlockHashesChainOverFullBlocksOnly) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b = {1, 2, 3, 4, 5, 6, 7, 9};
  const std::vector<BlockHash> ha = ChainBlockHashes(a, 4), hb = ChainBlockHashes(b, 4);
  ASSERT_EQ(ha.size(), 2u);  // the partial third block has no hash
  ASSERT_EQ(hb.size(), 2u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  // Chained: the same block after a different prefix hashes differently.
  const std::vector<int32_t> c = {0, 0, 0, 0, 5, 6, 7, 8};
  EXPECT_NE(ChainBlockHashes(c, 4)[1], ha[1]);
  EXPECT_EQ(ha[1], ChainBlockHash(ha[0], std::span<const int32_t>(a).subspan(4, 4)));
}

// SHA-256 over the parent (16 bytes, big-endian halves) and the token ids
// (4 bytes each, little-endian), truncated to 128 bits; the routing digest
// is the first 64. Values from Python's hashlib.
TEST(KvCacheManagerTest, BlockHashIsTruncatedSha256OfParentAndTokens) {
  const std::vector<int32_t> tokens = {1, 2, 3, -1, 5, 6, 7, 8};
  const std::vector<BlockHash> h = ChainBlockHashes(tokens, 4);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], (BlockHash{0xb31ff057d2334cf2ull, 0xb09939b912a11f13ull}));
  EXPECT_EQ(h[1], (BlockHash{0xe04b1112ac05d2caull, 0xda49e6f54818443aull}));
  EXPECT_EQ(BlockHashDigests(tokens, 4), (std::vector<uint64_t>{h[0].hi, h[1].hi}));
  EXPECT_TRUE(ChainBlockHashes(tokens, 0).empty());
}

TEST(KvCacheManagerTest, CachedBlocksAreSharedThenEvictableThenReused) {
  KvCacheManager bm(6, 4);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<BlockHash> hashes = ChainBlockHashes(prompt, 4);  // 2 full blocks
  ASSERT_EQ(bm.NumCachedBlocks(hashes), 0);
  ASSERT_EQ(*bm.AllocateCached(1, hashes, 10), 0);
  ASSERT_TRUE(bm.CommitBlockHashes(1, hashes).ok());
  EXPECT_EQ(bm.NumCachedBlocks(hashes), 2);
  // A second sequence with the same prefix shares both full blocks.
  EXPECT_EQ(bm.FreeBlocksNeeded(hashes, 10), 1);
  ASSERT_EQ(*bm.AllocateCached(2, hashes, 10), 2);
  EXPECT_EQ(Table(bm, 2)[0], Table(bm, 1)[0]);
  EXPECT_EQ(Table(bm, 2)[1], Table(bm, 1)[1]);
  EXPECT_NE(Table(bm, 2)[2], Table(bm, 1)[2]);
  EXPECT_EQ(bm.RefCount(Table(bm, 1)[0]), 2);
  EXPECT_EQ(bm.num_free_blocks(), 2);
  // Both gone: the hashed blocks stay cached as evictable, still free.
  const std::vector<int32_t> shared = {Table(bm, 1)[0], Table(bm, 1)[1]};
  bm.Free(1);
  bm.Free(2);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  EXPECT_EQ(bm.num_evictable_blocks(), 2);
  EXPECT_EQ(bm.NumCachedBlocks(hashes), 2);
  // Reuse takes the evictable blocks out of the free pool.
  EXPECT_EQ(bm.FreeBlocksNeeded(hashes, 10), 3);
  ASSERT_EQ(*bm.AllocateCached(3, hashes, 10), 2);
  EXPECT_EQ(Table(bm, 3)[0], shared[0]);
  EXPECT_EQ(bm.num_evictable_blocks(), 0);
  bm.Free(3);
  // Plain free blocks go first; then the least recently freed cached block
  // is evicted and forgets its content.
  ASSERT_TRUE(bm.Allocate(4, 16).ok());
  EXPECT_EQ(bm.num_evictable_blocks(), 2);
  ASSERT_TRUE(bm.Allocate(5, 4).ok());
  EXPECT_EQ(bm.num_evictable_blocks(), 1);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  EXPECT_LT(bm.NumCachedBlocks(hashes), 2);
  // Exhaustion changes nothing.
  EXPECT_EQ(bm.AllocateCached(6, hashes, 12).status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(bm.Contains(6));
  EXPECT_EQ(bm.num_free_blocks(), 1);
}

TEST(KvCacheManagerTest, ADuplicateHashKeepsTheFirstBlock) {
  KvCacheManager bm(8, 2);
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  const std::vector<BlockHash> hashes = ChainBlockHashes(prompt, 2);
  ASSERT_TRUE(bm.Allocate(1, 4).ok());
  ASSERT_TRUE(bm.Allocate(2, 4).ok());  // computed the same prompt without a hit
  ASSERT_TRUE(bm.CommitBlockHashes(1, hashes).ok());
  ASSERT_TRUE(bm.CommitBlockHashes(2, hashes).ok());
  bm.Free(2);
  EXPECT_EQ(bm.num_evictable_blocks(), 0);  // sequence 2's copies were never hashed
  ASSERT_EQ(*bm.AllocateCached(3, hashes, 4), 2);
  EXPECT_EQ(Table(bm, 3), Table(bm, 1));
  EXPECT_EQ(bm.CommitBlockHashes(9, hashes).code(), StatusCode::kNotFound);
  EXPECT_EQ(
      bm.CommitBlockHashes(1, ChainBlockHashes(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, 2)).code(),
      StatusCode::kInvalidArgument);
}

TEST(KvCacheManagerTest, DigestCarriesCachedHashesAtDigestPositions) {
  KvCacheManager bm(40, 1);
  // 20 one-token blocks: positions 0-3, 7, 15 are digest positions.
  std::vector<int32_t> prompt(20);
  for (int i = 0; i < 20; ++i) prompt[i] = 100 + i;
  const std::vector<BlockHash> hashes = ChainBlockHashes(prompt, 1);
  EXPECT_TRUE(bm.CachedHashDigest().empty());
  ASSERT_TRUE(bm.Allocate(1, 20).ok());
  ASSERT_TRUE(bm.CommitBlockHashes(1, hashes).ok());
  std::vector<uint64_t> want;
  for (int i : {0, 1, 2, 3, 7, 15}) want.push_back(hashes[i].digest());
  std::vector<uint64_t> digest = bm.CachedHashDigest();
  std::sort(digest.begin(), digest.end());
  std::vector<uint64_t> sorted_want = want;
  std::sort(sorted_want.begin(), sorted_want.end());
  EXPECT_EQ(digest, sorted_want);
  // Evictable blocks stay in the digest until they are reused; a cap keeps
  // the most recently freed first.
  bm.Free(1);
  EXPECT_EQ(bm.CachedHashDigest().size(), 6u);
  std::vector<int32_t> other(8, 7);
  ASSERT_TRUE(bm.Allocate(2, 8).ok());
  ASSERT_TRUE(bm.CommitBlockHashes(2, ChainBlockHashes(other, 1)).ok());
  bm.Free(2);
  const std::vector<uint64_t> capped = bm.CachedHashDigest(2);
  ASSERT_EQ(capped.size(), 2u);
  // Sequence 2 was freed last, first block last (Free releases in reverse).
  EXPECT_EQ(capped[0], ChainBlockHashes(other, 1)[0].digest());
  // Reusing the evicted blocks drops their hashes from the digest.
  ASSERT_TRUE(bm.Allocate(3, 40).ok());
  EXPECT_TRUE(bm.CachedHashDigest().empty());
  for (int position = 0; position < 64; ++position) {
    EXPECT_EQ(IsDigestPosition(position), position < 4 || position % 8 == 7) << position;
  }
}

TEST(KvCacheManagerTest, RandomCachedWorkloadKeepsInvariants) {
  // Prompts drawn from a few shared prefixes, committed, freed and reused.
  KvCacheManager bm(48, 4);
  std::mt19937_64 rng(7);
  std::vector<SeqId> live;
  SeqId next_id = 1;
  for (int op = 0; op < 5000; ++op) {
    if (live.empty() || rng() % 3 != 0) {
      std::vector<int32_t> prompt(4 * (1 + rng() % 5) + rng() % 4);
      const int32_t family = static_cast<int32_t>(rng() % 4);
      for (size_t i = 0; i < prompt.size(); ++i) {
        prompt[i] = i < 8 ? family : static_cast<int32_t>(rng() % 3);
      }
      const std::vector<BlockHash> hashes = ChainBlockHashes(prompt, 4);
      const int free_before = bm.num_free_blocks();
      const int needed = bm.FreeBlocksNeeded(hashes, static_cast<int>(prompt.size()));
      const SeqId seq = next_id++;
      absl::StatusOr<int> cached = bm.AllocateCached(seq, hashes, static_cast<int>(prompt.size()));
      if (!cached.ok()) {
        ASSERT_GT(needed, free_before);
        ASSERT_EQ(bm.num_free_blocks(), free_before);
        continue;
      }
      ASSERT_EQ(bm.num_free_blocks(), free_before - needed);
      ASSERT_TRUE(bm.CommitBlockHashes(seq, hashes).ok());
      live.push_back(seq);
    } else {
      const size_t idx = rng() % live.size();
      bm.Free(live[idx]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(idx));
    }
    if (op % 101 == 0) {
      ASSERT_NO_FATAL_FAILURE(CheckInvariants(bm, live));
    }
  }
  for (SeqId seq : live) bm.Free(seq);
  EXPECT_EQ(bm.num_free_blocks(), bm.num_blocks());
}

}  // namespace
}  // namespace pdserve::engine
