// KV rollback for speculative decoding: KvCacheManager::Truncate, and the
// scheduler under random proposals and random accept/reject (fabricated
// step outputs, no model): blocks never leak, each sequence holds exactly
// the blocks its tokens (or its admission reservation) need, and the prefix
// cache's hashes name computed tokens only.
#include <random>
#include <vector>

#include "engine/kvcache/kv_cache_manager.h"
#include "engine/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

TEST(KvTruncateTest, ReleasesTrailingBlocksOnly) {
  KvCacheManager kv(8, 4);
  ASSERT_TRUE(kv.Allocate(1, 10).ok());  // 3 blocks
  const std::vector<int32_t> before(kv.BlockTable(1).begin(), kv.BlockTable(1).end());
  ASSERT_TRUE(kv.Truncate(1, 5).ok());
  EXPECT_EQ(kv.BlockTable(1).size(), 2u);
  EXPECT_EQ(kv.BlockTable(1)[0], before[0]);
  EXPECT_EQ(kv.BlockTable(1)[1], before[1]);
  EXPECT_EQ(kv.num_free_blocks(), 6);
  ASSERT_TRUE(kv.Truncate(1, 8).ok());  // nothing past 2 blocks: no change
  EXPECT_EQ(kv.BlockTable(1).size(), 2u);
  // The released block is the next one handed out.
  ASSERT_TRUE(kv.Reserve(1, 12).ok());
  EXPECT_EQ(kv.BlockTable(1)[2], before[2]);
  EXPECT_EQ(kv.Truncate(7, 0).code(), absl::StatusCode::kNotFound);
}

TEST(KvTruncateTest, CommittedBlocksStayCached) {
  KvCacheManager kv(4, 2);
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const std::vector<BlockHash> hashes = ChainBlockHashes(tokens, 2);
  ASSERT_TRUE(kv.Allocate(1, 4).ok());
  ASSERT_TRUE(kv.CommitBlockHashes(1, hashes).ok());
  ASSERT_TRUE(kv.Truncate(1, 2).ok());
  EXPECT_EQ(kv.NumCachedBlocks(hashes), 2);  // the second block: evictable, content intact
  EXPECT_EQ(kv.num_evictable_blocks(), 1);
  kv.Free(1);
  EXPECT_EQ(kv.num_free_blocks(), 4);
}

ModelConfig TinyConfig() {
  ModelConfig c;
  c.vocab_size = 40;
  c.max_position_embeddings = 256;
  c.eos_token_ids = {};
  return c;
}

class RandomVerificationTest : public testing::TestWithParam<bool> {};

TEST_P(RandomVerificationTest, NoLeaksAndHashesNameComputedTokens) {
  const bool prefix_caching = GetParam();
  const ModelConfig config = TinyConfig();
  constexpr int kBlocks = 40, kBlockSize = 4;
  Scheduler scheduler({.role = SchedulerRole::kColocated,
                       .plan = {.max_num_seqs = 8, .max_batch_tokens = 64},
                       .enable_prefix_caching = prefix_caching,
                       .kv_headroom_tokens = 2},
                      config, kBlocks, kBlockSize);
  std::mt19937 rng(7);
  auto rand_int = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  constexpr int kSeqs = 12;
  for (SeqId id = 1; id <= kSeqs; ++id) {
    std::vector<int32_t> prompt(rand_int(3, 20));
    // Shared openings, so prefix caching has something to share.
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = i < 8 ? (id % 3) + i : rand_int(0, 39);
    SamplingParams params;
    params.max_tokens = rand_int(5, 40);
    params.ignore_eos = true;
    ASSERT_TRUE(scheduler.AddPrompt(id, prompt, params).ok());
  }
  int finished = 0, verified = 0, accepted = 0, rejected = 0;
  for (int step_no = 0; finished < kSeqs && step_no < 5000; ++step_no) {
    for (SeqId id : scheduler.DecodingSequences()) {
      std::vector<int32_t> proposal(rand_int(0, 5));
      for (int32_t& t : proposal) t = rand_int(0, 39);
      ASSERT_TRUE(scheduler.SetProposal(id, proposal).ok());
    }
    ScheduledStep step = scheduler.Schedule();
    ASSERT_TRUE(step.failed.empty());
    ASSERT_FALSE(step.empty());
    // A fabricated result: each verification row's argmax is its proposal
    // with probability 0.6, else another token.
    StepOutput out;
    out.sampled.resize(step.ids.size());
    for (size_t i = 0; i < step.ids.size(); ++i) {
      const StepSequence& s = step.batch.seqs[i];
      if (s.sampling != nullptr) out.sampled[i].token = rand_int(0, 39);
      for (int j = 0; j < s.num_verify_rows; ++j) {
        std::vector<float> row(config.vocab_size, 0.0f);
        const bool is_proposal = j + 1 < s.num_verify_rows;
        int32_t pick = rand_int(0, 39);
        if (is_proposal && rand_int(0, 9) < 6) pick = s.tokens[j + 1];
        row[pick] = 1.0f;
        out.verify_logits.insert(out.verify_logits.end(), row.begin(), row.end());
      }
    }
    for (const SequenceUpdate& u : scheduler.Complete(step, out)) {
      if (u.num_proposed > 0) {
        ++verified;
        accepted += u.num_accepted;
        rejected += u.num_accepted < u.num_proposed;
      }
      if (u.finish != FinishReason::kNone) ++finished;
    }
    // Invariants between steps.
    int held = 0;
    for (SeqId id = 1; id <= kSeqs; ++id) {
      const Scheduler::Sequence* seq = scheduler.Find(id);
      if (seq == nullptr || seq->state != Scheduler::State::kRunning) continue;
      const int tokens = static_cast<int>(seq->tokens.size());
      const int blocks = static_cast<int>(seq->block_table.size());
      EXPECT_EQ(blocks, scheduler.kv().Capacity(id) / kBlockSize);
      EXPECT_GE(blocks * kBlockSize, seq->num_computed);
      if (seq->num_computed + 1 == tokens) {
        // Decoding: never more than its tokens or reservation need (the
        // next token's block may still be missing: lazy growth).
        EXPECT_LE(blocks, scheduler.kv().BlocksForTokens(std::max(tokens, seq->reserve_tokens)))
            << "sequence " << id;
      }
      held += blocks;
      if (prefix_caching) {
        const std::vector<BlockHash> hashes = ChainBlockHashes(
            std::span<const int32_t>(seq->tokens).first(seq->num_computed), kBlockSize);
        EXPECT_EQ(scheduler.kv().NumCachedBlocks(hashes), static_cast<int>(hashes.size()));
      }
    }
    EXPECT_LE(scheduler.kv().num_used_blocks(), held);
  }
  EXPECT_EQ(finished, kSeqs);
  EXPECT_GT(verified, 50);
  EXPECT_GT(accepted, 20);
  EXPECT_GT(rejected, 20);
  EXPECT_EQ(scheduler.kv().num_sequences(), 0u);
  EXPECT_EQ(scheduler.kv().num_free_blocks(), kBlocks);
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, RandomVerificationTest, testing::Bool());

}  // namespace
}  // namespace pdserve::engine
