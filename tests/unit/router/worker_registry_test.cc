#include "router/worker_registry.h"

#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

WorkerDesc Desc(const std::string& id, Role role, uint64_t fingerprint = 42) {
  return WorkerDesc{.id = id, .role = role, .address = id + ":1",
                    .kv_endpoint = role == Role::kDecode ? "tcp://x:2" : "",
                    .model_fingerprint = fingerprint, .kv_block_size = 16};
}

TEST(WorkerRegistryTest, RegisterHeartbeatAndExpire) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d2", Role::kDecode), {}, kT0).ok());
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0).size(), 1u);
  EXPECT_EQ(registry.Live(Role::kDecode, kT0).size(), 2u);

  // d1 keeps beating, d2 goes silent.
  EXPECT_TRUE(registry.Heartbeat("d1", {.running_sequences = 3}, kT0 + absl::Seconds(2)));
  EXPECT_TRUE(registry.Heartbeat("p1", {}, kT0 + absl::Seconds(2)));
  auto live = registry.Live(Role::kDecode, kT0 + absl::Seconds(4));
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].desc.id, "d1");
  EXPECT_EQ(live[0].load.running_sequences, 3);
  // An expired worker is told it is unknown and must register again.
  EXPECT_FALSE(registry.Heartbeat("d2", {}, kT0 + absl::Seconds(4)));
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0 + absl::Seconds(4)), 1);
  registry.Deregister("d1");
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0 + absl::Seconds(4)), 0);
}

TEST(WorkerRegistryTest, DrainingWorkersAreNotOffered) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  EXPECT_TRUE(registry.Heartbeat("d1", {.draining = true}, kT0));
  EXPECT_TRUE(registry.Live(Role::kDecode, kT0).empty());
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0), 1);
}

TEST(WorkerRegistryTest, RejectsBadRegistrations) {
  WorkerRegistry registry(absl::Seconds(3));
  EXPECT_EQ(registry.Register(Desc("", Role::kPrefill), {}, kT0).code(), absl::StatusCode::kInvalidArgument);
  WorkerDesc no_kv = Desc("d", Role::kDecode);
  no_kv.kv_endpoint.clear();
  EXPECT_EQ(registry.Register(no_kv, {}, kT0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill, 1), {}, kT0).ok());
  absl::Status s = registry.Register(Desc("d1", Role::kDecode, 2), {}, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("fingerprint"), absl::string_view::npos);
  // Re-registering the same worker with a new model is allowed (restart).
  EXPECT_TRUE(registry.Register(Desc("p1", Role::kPrefill, 2), {}, kT0).ok());
}

TEST(WorkerRegistryTest, OutstandingIsTracked) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  registry.AddOutstanding("p1", 2, 100);
  registry.AddOutstanding("p1", -1, -40);
  registry.AddOutstanding("unknown", 1, 1);  // no-op
  auto live = registry.Live(Role::kPrefill, kT0);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].outstanding_requests, 1);
  EXPECT_EQ(live[0].outstanding_tokens, 60);
}

}  // namespace
}  // namespace pdserve::router
