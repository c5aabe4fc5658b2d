// The KV receiver's slot policy, as pure bookkeeping: which connection gives
// its slot up when a new one comes (tcp/connection_slots.h).
#include "kvtransfer/tcp/connection_slots.h"

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::kvtransfer::tcp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// `busy` ids have handshake bytes waiting; every other one is idle.
struct Busy {
  absl::flat_hash_set<uint64_t> ids;
  std::function<bool(uint64_t)> fn() const {
    return [this](uint64_t id) { return ids.contains(id); };
  }
};

TEST(ConnectionSlotsTest, AdmitsUpToTheCapThenEvictsTheOldestIdleStranger) {
  ConnectionSlots slots({.max_connections = 3, .max_unauthenticated_per_source = 10});
  Busy busy;
  for (uint64_t id = 1; id <= 3; ++id) {
    auto a = slots.Admit(id, "10.0.0.1", busy.fn());
    EXPECT_TRUE(a.admitted);
    EXPECT_THAT(a.evicted, IsEmpty());
  }
  // Full: the oldest (1) goes, whichever address the newcomer has.
  auto a = slots.Admit(4, "10.0.0.2", busy.fn());
  EXPECT_TRUE(a.admitted);
  EXPECT_THAT(a.evicted, ElementsAre(1));
  EXPECT_EQ(slots.used(), 3);
  // The evicted connection can no longer authenticate; the others can.
  EXPECT_FALSE(slots.Authenticate(1));
  EXPECT_TRUE(slots.Authenticate(2));
}

TEST(ConnectionSlotsTest, AuthenticatedConnectionsAreNeverEvicted) {
  ConnectionSlots slots({.max_connections = 2, .max_unauthenticated_per_source = 10});
  Busy busy;
  ASSERT_TRUE(slots.Admit(1, "10.0.0.1", busy.fn()).admitted);
  ASSERT_TRUE(slots.Admit(2, "10.0.0.1", busy.fn()).admitted);
  ASSERT_TRUE(slots.Authenticate(1));  // a transfer in progress
  // Full: 2 is the only stranger, so it goes, though 1 is older.
  auto a = slots.Admit(3, "10.0.0.9", busy.fn());
  EXPECT_TRUE(a.admitted);
  EXPECT_THAT(a.evicted, ElementsAre(2));
  ASSERT_TRUE(slots.Authenticate(3));
  // Every slot authenticated: the newcomer is refused, nobody evicted.
  auto refused = slots.Admit(4, "10.0.0.9", busy.fn());
  EXPECT_FALSE(refused.admitted);
  EXPECT_THAT(refused.evicted, IsEmpty());
  EXPECT_THAT(refused.refusal, HasSubstr("all 2 connection slots"));
  EXPECT_EQ(slots.used(), 2);
  // A slot freed by a close is taken again.
  slots.Release(1);
  EXPECT_TRUE(slots.Admit(5, "10.0.0.9", busy.fn()).admitted);
}

TEST(ConnectionSlotsTest, StrangersWithTheirHandshakeArrivingAreLeftAlone) {
  ConnectionSlots slots({.max_connections = 3, .max_unauthenticated_per_source = 10});
  Busy busy;
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(slots.Admit(id, "10.0.0.1", busy.fn()).admitted);
  busy.ids = {1, 2};  // their HEADER bytes are waiting to be read
  auto a = slots.Admit(4, "10.0.0.1", busy.fn());
  EXPECT_TRUE(a.admitted);
  EXPECT_THAT(a.evicted, ElementsAre(3));
  busy.ids = {1, 2, 4};
  auto refused = slots.Admit(5, "10.0.0.1", busy.fn());
  EXPECT_FALSE(refused.admitted);
  EXPECT_THAT(refused.refusal, HasSubstr("handshakes in progress"));
}

TEST(ConnectionSlotsTest, OneAddressHoldsAtMostItsShareOfStrangers) {
  ConnectionSlots slots({.max_connections = 100, .max_unauthenticated_per_source = 2});
  Busy busy;
  ASSERT_TRUE(slots.Admit(1, "10.0.0.1", busy.fn()).admitted);
  ASSERT_TRUE(slots.Admit(2, "10.0.0.2", busy.fn()).admitted);
  ASSERT_TRUE(slots.Admit(3, "10.0.0.1", busy.fn()).admitted);
  // A third stranger from 10.0.0.1 evicts that address's oldest (1), not
  // the older connection of 10.0.0.2.
  auto a = slots.Admit(4, "10.0.0.1", busy.fn());
  EXPECT_TRUE(a.admitted);
  EXPECT_THAT(a.evicted, ElementsAre(1));
  EXPECT_EQ(slots.unauthenticated_from("10.0.0.1"), 2);
  EXPECT_EQ(slots.unauthenticated_from("10.0.0.2"), 1);
  // Authenticated connections from the address do not count against it.
  ASSERT_TRUE(slots.Authenticate(3));
  ASSERT_TRUE(slots.Authenticate(4));
  EXPECT_EQ(slots.unauthenticated_from("10.0.0.1"), 0);
  for (uint64_t id = 5; id <= 6; ++id) {
    auto b = slots.Admit(id, "10.0.0.1", busy.fn());
    EXPECT_TRUE(b.admitted);
    EXPECT_THAT(b.evicted, IsEmpty());
  }
  // Both of the address's strangers busy: the next one is refused.
  busy.ids = {5, 6};
  auto refused = slots.Admit(7, "10.0.0.1", busy.fn());
  EXPECT_FALSE(refused.admitted);
  EXPECT_THAT(refused.refusal, HasSubstr("from 10.0.0.1"));
  EXPECT_EQ(slots.used(), 5);  // 2, 3, 4, 5, 6
}

TEST(ConnectionSlotsTest, ReleaseForgetsEveryKindOfConnection) {
  ConnectionSlots slots({.max_connections = 4, .max_unauthenticated_per_source = 4});
  Busy busy;
  ASSERT_TRUE(slots.Admit(1, "a", busy.fn()).admitted);
  ASSERT_TRUE(slots.Admit(2, "a", busy.fn()).admitted);
  ASSERT_TRUE(slots.Authenticate(2));
  slots.Release(1);
  slots.Release(2);
  slots.Release(99);  // unknown: a no-op
  EXPECT_EQ(slots.used(), 0);
  EXPECT_EQ(slots.unauthenticated(), 0);
  EXPECT_EQ(slots.unauthenticated_from("a"), 0);
}

}  // namespace
}  // namespace pdserve::kvtransfer::tcp
