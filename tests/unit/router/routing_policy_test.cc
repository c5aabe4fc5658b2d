#include "router/routing_policy.h"

#include <memory>
#include <vector>

#include "engine/kvcache/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

WorkerView Prefill(const std::string& id, int64_t reported_tokens, int64_t outstanding_tokens) {
  WorkerView w;
  w.desc.id = id;
  w.desc.kv_block_size = 16;
  w.load.queued_prompt_tokens = reported_tokens;
  w.outstanding_tokens = outstanding_tokens;
  return w;
}

WorkerView Decode(const std::string& id, int running, int outstanding, int free_blocks) {
  WorkerView w;
  w.desc.id = id;
  w.desc.kv_block_size = 16;
  w.load.running_sequences = running;
  w.load.free_kv_blocks = free_blocks;
  w.load.total_kv_blocks = 100;
  w.outstanding_requests = outstanding;
  return w;
}

// A prompt of `n` tokens starting with the 1,000-token "system prompt".
std::vector<int32_t> WithSystemPrompt(int n, int32_t question) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = i < 1000 ? 5 + i % 200 : question;
  return p;
}

// Marks `w` as holding `prompt`'s blocks cached, as its digest would.
void Holds(WorkerView& w, const std::vector<int32_t>& prompt) {
  auto set = std::make_shared<PrefixHashSet>();
  const std::vector<uint64_t> hashes = engine::BlockHashDigests(prompt, w.desc.kv_block_size);
  for (int i = 0; i < static_cast<int>(hashes.size()); ++i) {
    if (engine::IsDigestPosition(i)) set->insert(hashes[i]);
  }
  w.cached_prefixes = std::move(set);
}

const std::vector<int32_t> kShortPrompt(10, 3);

TEST(LeastLoadedPolicyTest, PrefillPicksFewestQueuedTokens) {
  LeastLoadedPolicy policy;
  const PrefillQuery query(kShortPrompt);
  EXPECT_FALSE(policy.PickPrefill({}, query).has_value());
  std::vector<WorkerView> pool = {Prefill("a", 500, 0), Prefill("b", 100, 0), Prefill("c", 300, 0)};
  EXPECT_EQ(policy.PickPrefill(pool, query), 1u);
  // This router's own outstanding work counts before a heartbeat shows it.
  pool[1].outstanding_tokens = 1000;
  EXPECT_EQ(policy.PickPrefill(pool, query), 2u);
  // Cached prefixes do not matter to it.
  const std::vector<int32_t> prompt = WithSystemPrompt(1030, 9);
  Holds(pool[0], prompt);
  EXPECT_EQ(policy.PickPrefill(pool, PrefillQuery(prompt)), 2u);
}

TEST(LeastLoadedPolicyTest, DecodePicksFewestSequencesThatFit) {
  LeastLoadedPolicy policy;
  EXPECT_FALSE(policy.PickDecode({}, {.prompt_tokens = 10, .max_tokens = 1}).has_value());
  std::vector<WorkerView> pool = {Decode("a", 5, 0, 50), Decode("b", 2, 0, 1), Decode("c", 3, 0, 50)};
  // b has fewest sequences but 1 free block (16 tokens) cannot hold 100.
  const DecodeQuery hundred{.prompt_tokens = 50, .max_tokens = 51};
  EXPECT_EQ(policy.PickDecode(pool, hundred), 2u);
  EXPECT_EQ(policy.PickDecode(pool, {.prompt_tokens = 8, .max_tokens = 9}), 1u);
  // Outstanding requests count as load.
  pool[2].outstanding_requests = 9;
  EXPECT_EQ(policy.PickDecode(pool, hundred), 0u);
  // When none seems to fit, the least loaded is still asked.
  EXPECT_EQ(policy.PickDecode(pool, {.prompt_tokens = 100000, .max_tokens = 1}), 1u);
}

// Decode workers reserve the prompt plus their headroom, not the whole
// request: the fit check asks for what the worker will really take.
TEST(LeastLoadedPolicyTest, DecodeFitFollowsTheWorkersLazyReservation) {
  LeastLoadedPolicy policy;
  std::vector<WorkerView> pool = {Decode("a", 9, 0, 100), Decode("b", 1, 0, 10)};
  pool[1].desc.kv_headroom_tokens = 32;
  const DecodeQuery query{.prompt_tokens = 100, .max_tokens = 1000};
  EXPECT_EQ(DecodeAdmissionTokens(pool[0], query), 1099);  // whole request
  EXPECT_EQ(DecodeAdmissionTokens(pool[1], query), 132);   // prompt + headroom
  EXPECT_EQ(DecodeAdmissionTokens(pool[1], {.prompt_tokens = 100, .max_tokens = 5}), 104);
  // b's 10 free blocks (160 tokens) fit its 132, a's 100 fit 1,099: both
  // fit, and b runs fewer sequences.
  EXPECT_EQ(policy.PickDecode(pool, query), 1u);
  pool[1].load.free_kv_blocks = 8;  // 128 < 132
  EXPECT_EQ(policy.PickDecode(pool, query), 0u);
}

TEST(LeastLoadedPolicyTest, TiesGoToTheFirst) {
  LeastLoadedPolicy policy;
  std::vector<WorkerView> pool = {Prefill("a", 0, 0), Prefill("b", 0, 0)};
  EXPECT_EQ(policy.PickPrefill(pool, PrefillQuery(kShortPrompt)), 0u);
}

TEST(PrefixAwarePolicyTest, PicksTheWorkerHoldingThePrefix) {
  PrefixAwarePolicy policy;
  const std::vector<int32_t> prompt = WithSystemPrompt(1030, 9);
  const PrefillQuery query(prompt);
  std::vector<WorkerView> pool = {Prefill("a", 0, 0), Prefill("b", 200, 0), Prefill("c", 100, 0)};
  // Nobody holds it: least loaded.
  EXPECT_EQ(policy.PickPrefill(pool, query), 0u);
  // b holds the system prompt (another question after it) and wins over
  // an idle worker: 200 queued + 134 uncached < 0 + 1,030. Its 62 shared
  // blocks are seen down to digest position 55: 56 blocks.
  Holds(pool[1], WithSystemPrompt(1040, 77));
  EXPECT_EQ(CachedPrefixTokens(pool[1], query), 896);
  EXPECT_EQ(policy.PickPrefill(pool, query), 1u);
  EXPECT_EQ(policy.PickPrefill(pool, PrefillQuery(kShortPrompt)), 0u);  // unrelated prompt
}

TEST(PrefixAwarePolicyTest, AnOverloadedHolderShedsLoad) {
  PrefixAwarePolicy policy;
  const std::vector<int32_t> prompt = WithSystemPrompt(1030, 9);
  const PrefillQuery query(prompt);
  std::vector<WorkerView> pool = {Prefill("a", 0, 0), Prefill("b", 0, 0)};
  Holds(pool[1], prompt);
  pool[1].outstanding_tokens = 900;  // 900 + 6 < 1,030: still b
  EXPECT_EQ(policy.PickPrefill(pool, query), 1u);
  pool[1].load.queued_prompt_tokens = 1200;  // its report says more: a
  EXPECT_EQ(policy.PickPrefill(pool, query), 0u);
  // Once both hold it, the less loaded of the two.
  Holds(pool[0], prompt);
  pool[0].outstanding_tokens = 300;
  EXPECT_EQ(policy.PickPrefill(pool, query), 0u);
}

TEST(RoutingPolicyTest, FactoryKnowsItsNames) {
  EXPECT_TRUE(CreateRoutingPolicy("least_loaded").ok());
  EXPECT_TRUE(CreateRoutingPolicy("prefix_aware").ok());
  EXPECT_EQ(CreateRoutingPolicy("random").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::router
