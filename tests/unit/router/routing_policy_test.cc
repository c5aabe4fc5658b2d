#include "router/routing_policy.h"

#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

WorkerView Prefill(const std::string& id, int64_t reported_tokens, int64_t outstanding_tokens) {
  WorkerView w;
  w.desc.id = id;
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

TEST(LeastLoadedPolicyTest, PrefillPicksFewestQueuedTokens) {
  LeastLoadedPolicy policy;
  EXPECT_FALSE(policy.PickPrefill({}, 10).has_value());
  std::vector<WorkerView> pool = {Prefill("a", 500, 0), Prefill("b", 100, 0), Prefill("c", 300, 0)};
  EXPECT_EQ(policy.PickPrefill(pool, 10), 1u);
  // This router's own outstanding work counts before a heartbeat shows it.
  pool[1].outstanding_tokens = 1000;
  EXPECT_EQ(policy.PickPrefill(pool, 10), 2u);
}

TEST(LeastLoadedPolicyTest, DecodePicksFewestSequencesThatFit) {
  LeastLoadedPolicy policy;
  EXPECT_FALSE(policy.PickDecode({}, 10).has_value());
  std::vector<WorkerView> pool = {Decode("a", 5, 0, 50), Decode("b", 2, 0, 1), Decode("c", 3, 0, 50)};
  // b has fewest sequences but 1 free block (16 tokens) cannot hold 100.
  EXPECT_EQ(policy.PickDecode(pool, 100), 2u);
  EXPECT_EQ(policy.PickDecode(pool, 16), 1u);
  // Outstanding requests count as load.
  pool[2].outstanding_requests = 9;
  EXPECT_EQ(policy.PickDecode(pool, 100), 0u);
  // When none seems to fit, the least loaded is still asked.
  EXPECT_EQ(policy.PickDecode(pool, 100000), 1u);
}

TEST(LeastLoadedPolicyTest, TiesGoToTheFirst) {
  LeastLoadedPolicy policy;
  std::vector<WorkerView> pool = {Prefill("a", 0, 0), Prefill("b", 0, 0)};
  EXPECT_EQ(policy.PickPrefill(pool, 1), 0u);
}

TEST(RoutingPolicyTest, FactoryKnowsItsNames) {
  EXPECT_TRUE(CreateRoutingPolicy("least_loaded").ok());
  EXPECT_EQ(CreateRoutingPolicy("random").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::router
