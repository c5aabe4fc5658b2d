#include "router/worker_registry.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

WorkerDesc Desc(const std::string& id, Role role, uint64_t fingerprint = 42) {
  return WorkerDesc{.id = id,
                    .role = role,
                    .address = id + ":1",
                    .kv_endpoint = role == Role::kDecode ? "tcp://x:2" : "",
                    .model_fingerprint = fingerprint,
                    .kv_block_size = 16};
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
  EXPECT_EQ(registry.Register(Desc("", Role::kPrefill), {}, kT0).code(),
            absl::StatusCode::kInvalidArgument);
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
  OutstandingWork a = registry.StartWork("p1", 60);
  OutstandingWork b = registry.StartWork("p1", 40);
  OutstandingWork none = registry.StartWork("unknown", 1);  // empty handle
  b.Release();
  b.Release();  // once only
  auto live = registry.Live(Role::kPrefill, kT0);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].outstanding_requests, 1);
  EXPECT_EQ(live[0].outstanding_tokens, 60);
  OutstandingWork moved = std::move(a);
  a.Release();  // moved-from: no effect
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0)[0].outstanding_requests, 1);
  moved.Release();
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0)[0].outstanding_requests, 0);
}

// A worker dropped for missed heartbeats and registered again starts from
// zero; work sent to it before must not drive its count negative (a negative
// count once made every burst pick that one worker).
TEST(WorkerRegistryTest, WorkOfAnEarlierIncarnationDoesNotCountAgainstTheNewOne) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  std::vector<OutstandingWork> old_work;
  for (int i = 0; i < 5; ++i) old_work.push_back(registry.StartWork("p1", 100));
  const absl::Time later = kT0 + absl::Seconds(10);
  EXPECT_TRUE(registry.Live(Role::kPrefill, later).empty());  // expired
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, later).ok());
  OutstandingWork fresh = registry.StartWork("p1", 7);
  old_work.clear();  // the old requests end
  auto live = registry.Live(Role::kPrefill, later);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].outstanding_requests, 1);
  EXPECT_EQ(live[0].outstanding_tokens, 7);
  // Re-registering while still live (a restart the router saw) keeps counts.
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, later).ok());
  fresh.Release();
  EXPECT_EQ(registry.Live(Role::kPrefill, later)[0].outstanding_requests, 0);
}

}  // namespace
}  // namespace pdserve::router
