// Transport selection: by kind, and by endpoint scheme through the routing
// sender (one loopback transfer end to end).
#include "kvtransfer/transport_factory.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace pdserve::kvtransfer {
namespace {

using testing::DoneWaiter;
using ::testing::HasSubstr;
using testing::RandomLayers;
using testing::RecordingSink;
using testing::Side;
using testing::SmallSpec;

TEST(TransportFactoryTest, TcpIsBuiltInOthersAreNot) {
  Side side(SmallSpec(), 8, 4, 1);
  EXPECT_TRUE(CreateKvSender("tcp", side.regions()).ok());
  auto receiver = CreateKvReceiver("tcp", "127.0.0.1", 0, side.regions());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  EXPECT_THAT((*receiver)->endpoint(), ::testing::StartsWith("tcp://127.0.0.1:"));

  auto nccl = CreateKvSender("nccl", side.regions());
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nccl.status().message()),
              HasSubstr("kv transport 'nccl' is not built in this binary"));
  EXPECT_EQ(CreateKvReceiver("cuda_ipc", "127.0.0.1", 0, side.regions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TransportFactoryTest, KindOfEndpoint) {
  EXPECT_EQ(*TransportKindOf("tcp://127.0.0.1:5"), "tcp");
  EXPECT_EQ(*TransportKindOf("nccl://peer/3"), "nccl");
  EXPECT_EQ(TransportKindOf("127.0.0.1:5").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransportKindOf("://x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransportFactoryTest, RoutingSenderPicksTransportByScheme) {
  Side src(SmallSpec(), 8, 4, 1);
  Side dst(SmallSpec(), 8, 3, 2);
  auto receiver = CreateKvReceiver("tcp", "127.0.0.1", 0, dst.regions());
  ASSERT_TRUE(receiver.ok());
  auto sender = CreateKvSenderForAnyEndpoint(src.regions());
  EXPECT_EQ(sender->Open("nccl://peer", 1, SmallSpec()).status().code(),
            absl::StatusCode::kInvalidArgument);

  const TransferSpec spec = SmallSpec(2);
  const auto layers = RandomLayers(spec, 1);
  auto sink = std::make_shared<RecordingSink>();
  sink->Watch(&dst.kv(), dst.Table(5, spec.num_tokens), spec.num_tokens);
  ASSERT_TRUE(
      (*receiver)->Expect(5, spec, dst.Table(5, spec.num_tokens), sink, testing::kWait).ok());
  auto session = sender->Open((*receiver)->endpoint(), 5, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(testing::SendPayload(**session, src, 5, 0, layers[0], spec.num_tokens).ok());
  ASSERT_TRUE(testing::SendPayload(**session, src, 5, 1, layers[1], spec.num_tokens).ok());
  DoneWaiter done;
  (*session)->Finish(77, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  EXPECT_EQ(**result, 77);
  EXPECT_TRUE(sink->layers()[1] == layers[1]);
}

}  // namespace
}  // namespace pdserve::kvtransfer
