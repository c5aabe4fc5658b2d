// The TCP kv transport end to end over loopback: a TcpKvReceiver on
// 127.0.0.1 port 0 and a TcpKvSender (or a raw socket speaking the wire
// format by hand). Every wait is bounded by kWait; a hang is a failure.
#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"
#include "kvtransfer/tcp/wire.h"
#include "test_util.h"
#include "tests/util/poll.h"

namespace pdserve::kvtransfer {
namespace {

using testing::DoneWaiter;
using ::testing::HasSubstr;
using testing::kWait;
using testing::RandomLayers;
using testing::RecordingSink;
using testing::Side;
using testing::SmallSpec;

// The shape every fixture transfer fits: up to 8 layers, SmallSpec's heads.
// The two sides use different block sizes, and allocate blocks in different
// shuffled orders.
const TransferSpec kShape = SmallSpec(8);

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TcpReceiverOptions FastReceiverOptions() {
  TcpReceiverOptions o;
  o.handshake_timeout = absl::Seconds(3);
  o.linger = absl::Milliseconds(500);
  return o;
}

TcpSenderOptions FastSenderOptions() {
  TcpSenderOptions o;
  o.connect_timeout = absl::Seconds(2);
  o.handshake_timeout = absl::Seconds(3);
  o.io_timeout = absl::Seconds(3);
  o.final_ack_timeout = absl::Seconds(3);
  o.abort_grace = absl::Milliseconds(500);
  return o;
}

// Timeouts no test outlasts: a test that must not wait for one of them uses
// these, so that waiting for it would hold the test until ctest's timeout
// rather than show as a time.
TcpSenderOptions NeverTimingOutSenderOptions() {
  TcpSenderOptions o = FastSenderOptions();
  o.handshake_timeout = o.io_timeout = o.final_ack_timeout = absl::Minutes(30);
  return o;
}

std::unique_ptr<KvSender> MakeSender(std::span<const engine::KvRegion> regions,
                                     TcpSenderOptions options = FastSenderOptions()) {
  auto sender = TcpKvSender::Create(regions, std::move(options));
  EXPECT_TRUE(sender.ok()) << sender.status();
  return sender.ok() ? std::move(*sender) : nullptr;
}

class TcpTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_.regions(), FastReceiverOptions());
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = std::move(*receiver);
    sender_ = MakeSender(src_.regions());
  }

  // Expects transfer `id` into fresh destination blocks; `sink` reads each
  // finished layer back out of them.
  absl::Status Expect(TransferId id, const TransferSpec& spec, std::shared_ptr<RecordingSink> sink,
                      absl::Duration timeout, KvReceiver* receiver = nullptr) {
    const std::vector<int32_t>& table = dst_.Table(id, spec.num_tokens);
    if (sink != nullptr) sink->Watch(&dst_.kv(), table, spec.num_tokens);
    return (receiver != nullptr ? receiver : receiver_.get())
        ->Expect(id, spec, table, std::move(sink), timeout);
  }
  // Stages `payload` (one layer of transfer `id`) into the source blocks and
  // queues it.
  absl::Status Send(SendSession& session, TransferId id, int layer,
                    const std::vector<std::byte>& payload) {
    const int tokens = static_cast<int>(payload.size() / (2 * kShape.TokenBytes()));
    return testing::SendPayload(session, src_, id, layer, payload, tokens);
  }
  // Sends `layers` in `order`. Returns the SendLayer errors, if any.
  absl::Status SendAll(SendSession& session, TransferId id,
                       const std::vector<std::vector<std::byte>>& layers,
                       const std::vector<int>& order) {
    for (int i : order) {
      absl::Status s = Send(session, id, i, layers[i]);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  static std::vector<int> InOrder(int n) {
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    return order;
  }
  void ExpectReceivedExactly(RecordingSink& sink,
                             const std::vector<std::vector<std::byte>>& layers) {
    auto got = sink.layers();
    ASSERT_EQ(got.size(), layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      EXPECT_TRUE(got[static_cast<int>(i)] == layers[i]) << "layer " << i << " differs";
    }
  }

  Side src_{kShape, 512, 5, 11};
  Side dst_{kShape, 1024, 4, 12};
  std::unique_ptr<KvReceiver> receiver_;
  std::unique_ptr<KvSender> sender_;
};

TEST_F(TcpTransportTest, EndpointNamesLoopbackAndPort) {
  EXPECT_THAT(receiver_->endpoint(), ::testing::StartsWith("tcp://127.0.0.1:"));
  auto parsed = tcp::ParseTcpEndpoint(receiver_->endpoint());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_GT(parsed->port, 0);
}

TEST_F(TcpTransportTest, FullTransferIsByteExactAndDeliversFirstToken) {
  const TransferSpec spec = SmallSpec(6, 16);
  const auto layers = RandomLayers(spec, 1);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(7, spec, sink, kWait).ok());

  auto session = sender_->Open(receiver_->endpoint(), 7, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(SendAll(**session, 7, layers, InOrder(spec.num_layers)).ok());
  DoneWaiter done;
  (*session)->Finish(31337, done.Callback());
  session->reset();  // dropping the session after Finish must not abort it

  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value()) << "done not called";
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value()) << "OnComplete not called";
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ(**result, 31337);
  ExpectReceivedExactly(*sink, layers);
  EXPECT_EQ(sink->complete_calls(), 1);
  EXPECT_EQ(done.calls(), 1);
}

TEST_F(TcpTransportTest, LargeLayersSurvivePartialWrites) {
  // 4 layers of 8 MiB: far beyond the socket buffers.
  TransferSpec spec = SmallSpec(4, 2048);
  spec.num_kv_heads = 8;
  spec.head_dim = 64;
  const auto layers = RandomLayers(spec, 2);
  Side src(spec, 2048 / 16, 16, 21);
  Side dst(spec, 2048 / 32, 32, 22);
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst.regions(), FastReceiverOptions());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  auto sender = MakeSender(src.regions());
  auto sink = std::make_shared<RecordingSink>();
  sink->Watch(&dst.kv(), dst.Table(8, spec.num_tokens), spec.num_tokens);
  ASSERT_TRUE(
      (*receiver)->Expect(8, spec, dst.Table(8, spec.num_tokens), sink, absl::Seconds(20)).ok());
  auto session = sender->Open((*receiver)->endpoint(), 8, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  for (int i = 0; i < spec.num_layers; ++i) {
    ASSERT_TRUE(testing::SendPayload(**session, src, 8, i, layers[i], spec.num_tokens).ok());
  }
  DoneWaiter done;
  (*session)->Finish(-5, done.Callback());
  auto sent = done.Wait(absl::Seconds(20));
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  EXPECT_EQ(**result, -5);
  ExpectReceivedExactly(*sink, layers);
}

TEST_F(TcpTransportTest, LayersInTokenChunksAcrossBlockLayoutsAreByteExact) {
  // Chunks of 5, 6 and 5 tokens: boundaries fall inside blocks of 5
  // (sender) and 4 (receiver) tokens, layers interleaved.
  const TransferSpec spec = SmallSpec(3, 16);
  const auto layers = RandomLayers(spec, 41);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(42, spec, sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 42, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  const std::vector<int32_t>& table = src_.Table(42, spec.num_tokens);
  for (int i = 0; i < spec.num_layers; ++i) src_.kv().WriteLayer(i, table, layers[i]);
  const int bounds[] = {0, 5, 11, 16};
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < spec.num_layers; ++i) {
      ASSERT_TRUE((*session)
                      ->SendLayer({.layer = i,
                                   .token_begin = bounds[c],
                                   .num_tokens = bounds[c + 1] - bounds[c],
                                   .block_table = table})
                      .ok());
    }
  }
  DoneWaiter done;
  (*session)->Finish(4, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  EXPECT_EQ(sink->layer_calls(), 9);
  ExpectReceivedExactly(*sink, layers);
}

TEST_F(TcpTransportTest, SequentialTransfersShareOnePooledConnection) {
  const TransferSpec spec = SmallSpec(2);
  for (TransferId id = 50; id < 55; ++id) {
    const auto layers = RandomLayers(spec, static_cast<uint32_t>(id));
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(Expect(id, spec, sink, kWait).ok());
    auto session = sender_->Open(receiver_->endpoint(), id, spec);
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_TRUE(SendAll(**session, id, layers, InOrder(2)).ok());
    DoneWaiter done;
    (*session)->Finish(static_cast<int32_t>(id), done.Callback());
    auto sent = done.Wait();
    ASSERT_TRUE(sent.has_value());
    ASSERT_TRUE(sent->ok()) << *sent;
    auto result = sink->WaitResult();
    ASSERT_TRUE(result.has_value() && result->ok());
    EXPECT_EQ(**result, static_cast<int32_t>(id));
    ExpectReceivedExactly(*sink, layers);
  }
  EXPECT_EQ(static_cast<TcpKvReceiver*>(receiver_.get())->connections_accepted(), 1);
}

TEST_F(TcpTransportTest, ConnectionClosedByTheReceiverIsReplaced) {
  TcpReceiverOptions options = FastReceiverOptions();
  options.idle_timeout = absl::Milliseconds(100);  // below the sender's: closes first
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_.regions(), options);
  ASSERT_TRUE(receiver.ok());
  const TransferSpec spec = SmallSpec(2);
  for (TransferId id = 60; id < 62; ++id) {
    const auto layers = RandomLayers(spec, static_cast<uint32_t>(id));
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(Expect(id, spec, sink, kWait, receiver->get()).ok());
    auto session = sender_->Open((*receiver)->endpoint(), id, spec);
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_TRUE(SendAll(**session, id, layers, InOrder(2)).ok());
    DoneWaiter done;
    (*session)->Finish(1, done.Callback());
    auto sent = done.Wait();
    ASSERT_TRUE(sent.has_value());
    EXPECT_TRUE(sent->ok()) << *sent;
    auto result = sink->WaitResult();
    ASSERT_TRUE(result.has_value() && result->ok()) << id;
    ExpectReceivedExactly(*sink, layers);
    absl::SleepFor(absl::Milliseconds(400));  // the receiver drops the idle connection
  }
  EXPECT_EQ((*receiver)->connections_accepted(), 2);
}

TEST_F(TcpTransportTest, LayersMaySendOutOfOrder) {
  const TransferSpec spec = SmallSpec(5);
  const auto layers = RandomLayers(spec, 3);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(9, spec, sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 9, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(SendAll(**session, 9, layers, {3, 0, 4, 2, 1}).ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  ExpectReceivedExactly(*sink, layers);
}

struct MismatchCase {
  const char* name;
  void (*change)(TransferSpec&);
  const char* field;
};

class SpecMismatchTest : public TcpTransportTest,
                         public ::testing::WithParamInterface<MismatchCase> {};

TEST_P(SpecMismatchTest, RefusedOnBothSidesNamingTheField) {
  const TransferSpec expected = SmallSpec();
  TransferSpec sent_spec = expected;
  GetParam().change(sent_spec);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(11, expected, sink, kWait).ok());
  // A sender whose own regions hold what it announces.
  Side sent_side(sent_spec, 64, 5, 31);
  auto sender = MakeSender(sent_side.regions());
  auto session = sender->Open(receiver_->endpoint(), 11, sent_spec);
  ASSERT_TRUE(session.ok()) << session.status();
  const auto layers = RandomLayers(sent_spec, 4);
  auto send = [&](int layer) {
    return testing::SendPayload(**session, sent_side, 11, layer, layers[layer],
                                sent_spec.num_tokens);
  };
  send(0).IgnoreError();  // may or may not fail yet
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());

  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->code(), absl::StatusCode::kFailedPrecondition) << *sent;
  EXPECT_THAT(Msg(*sent), HasSubstr("refused"));
  EXPECT_THAT(Msg(*sent), HasSubstr(absl::StrCat("spec mismatch: ", GetParam().field)));
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kFailedPrecondition) << result->status();
  EXPECT_THAT(Msg(result->status()), HasSubstr(absl::StrCat("spec mismatch: ", GetParam().field)));
  EXPECT_EQ(sink->layer_calls(), 0);
  // The failure is sticky on the sender side.
  EXPECT_FALSE(send(1).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Fields, SpecMismatchTest,
    ::testing::Values(
        MismatchCase{"fingerprint", [](TransferSpec& s) { s.model_fingerprint ^= 1; },
                     "model_fingerprint"},
        MismatchCase{"dtype",
                     [](TransferSpec& s) {
                       s.dtype = "f16";
                       s.bytes_per_element = 2;
                     },
                     "dtype"},
        MismatchCase{"num_tokens", [](TransferSpec& s) { s.num_tokens += 1; }, "num_tokens"},
        MismatchCase{"num_layers", [](TransferSpec& s) { s.num_layers += 1; }, "num_layers"},
        MismatchCase{"layout", [](TransferSpec& s) { s.layout = "paged_hnd"; }, "layout"}),
    [](const ::testing::TestParamInfo<MismatchCase>& info) { return info.param.name; });

TEST_F(TcpTransportTest, UnknownTransferIdIsRefused) {
  const TransferSpec spec = SmallSpec();
  auto session = sender_->Open(receiver_->endpoint(), 404, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->code(), absl::StatusCode::kFailedPrecondition) << *sent;
  EXPECT_THAT(Msg(*sent), HasSubstr("unknown transfer id 404"));
}

TEST_F(TcpTransportTest, SecondConnectionForSameIdIsRefusedFirstCompletes) {
  const TransferSpec spec = SmallSpec(2);
  const auto layers = RandomLayers(spec, 5);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(12, spec, sink, kWait).ok());
  auto first = sender_->Open(receiver_->endpoint(), 12, spec);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(Send(**first, 12, 0, layers[0]).ok());
  ASSERT_TRUE(sink->WaitLayers(1));  // the first connection has claimed the id
  auto second = sender_->Open(receiver_->endpoint(), 12, spec);
  ASSERT_TRUE(second.ok());
  DoneWaiter second_done;
  (*second)->Finish(1, second_done.Callback());
  auto refused = second_done.Wait();
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(Msg(*refused), HasSubstr("already has a sender connection"));

  ASSERT_TRUE(Send(**first, 12, 1, layers[1]).ok());
  DoneWaiter first_done;
  (*first)->Finish(2, first_done.Callback());
  auto sent = first_done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  EXPECT_EQ(**result, 2);
}

TEST_F(TcpTransportTest, SenderAbortReachesReceiverWithMessage) {
  const TransferSpec spec = SmallSpec();
  const auto layers = RandomLayers(spec, 6);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(13, spec, sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 13, spec);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(Send(**session, 13, 0, layers[0]).ok());
  (*session)->Abort(absl::InternalError("prefill ran out of memory"));

  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kAborted) << result->status();
  EXPECT_THAT(Msg(result->status()), HasSubstr("prefill ran out of memory"));
  // The session is over for the caller too.
  EXPECT_FALSE(Send(**session, 13, 1, layers[1]).ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_THAT(Msg(*sent), HasSubstr("prefill ran out of memory"));
}

TEST_F(TcpTransportTest, AbortRightAfterOpenStillDeliversTheMessage) {
  const TransferSpec spec = SmallSpec();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(14, spec, sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 14, spec);
  ASSERT_TRUE(session.ok());
  (*session)->Abort(absl::CancelledError("client went away"));
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_THAT(Msg(result->status()), HasSubstr("client went away"));
}

TEST_F(TcpTransportTest, DroppingSessionMidTransferFailsReceiver) {
  const TransferSpec spec = SmallSpec();
  const auto layers = RandomLayers(spec, 7);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(15, spec, sink, kWait).ok());
  {
    auto session = sender_->Open(receiver_->endpoint(), 15, spec);
    ASSERT_TRUE(session.ok());
    ASSERT_TRUE(Send(**session, 15, 0, layers[0]).ok());
    ASSERT_TRUE(Send(**session, 15, 1, layers[1]).ok());
  }  // destroyed without Finish
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value()) << "receiver hung after the sender went away";
  EXPECT_FALSE(result->ok());
  EXPECT_THAT(Msg(result->status()), HasSubstr("sender dropped the transfer"));
}

TEST_F(TcpTransportTest, ReceiverCancelMidTransfer) {
  const TransferSpec spec = SmallSpec(4);
  const auto layers = RandomLayers(spec, 8);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(16, spec, sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 16, spec);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(Send(**session, 16, 0, layers[0]).ok());
  ASSERT_TRUE(sink->WaitLayers(1));

  receiver_->Cancel(16);
  const int layers_at_cancel = sink->layer_calls();
  auto result = sink->WaitResult(absl::ZeroDuration());  // delivered before Cancel returned
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled) << result->status();

  for (int i = 1; i < spec.num_layers; ++i) {
    Send(**session, 16, i, layers[i]).IgnoreError();  // may already report the failure
  }
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value()) << "sender hung after the receiver cancelled";
  EXPECT_FALSE(sent->ok());
  EXPECT_EQ(sink->layer_calls(), layers_at_cancel);
  EXPECT_EQ(sink->layers_after_complete(), 0);
  EXPECT_EQ(sink->complete_calls(), 1);
  receiver_->Cancel(16);  // a second Cancel is a no-op
  EXPECT_EQ(sink->complete_calls(), 1);
}

TEST_F(TcpTransportTest, CancelBeforeSenderConnects) {
  const TransferSpec spec = SmallSpec();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(17, spec, sink, kWait).ok());
  receiver_->Cancel(17);
  auto result = sink->WaitResult(absl::ZeroDuration());
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled);
  auto session = sender_->Open(receiver_->endpoint(), 17, spec);
  ASSERT_TRUE(session.ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_THAT(Msg(*sent), HasSubstr("unknown transfer id 17"));
}

TEST_F(TcpTransportTest, ExpectTimesOutWithoutSender) {
  auto sink = std::make_shared<RecordingSink>();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(Expect(18, SmallSpec(), sink, absl::Milliseconds(200)).ok());
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kDeadlineExceeded) << result->status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  EXPECT_EQ(sink->complete_calls(), 1);
}

TEST_F(TcpTransportTest, ExpectTimesOutWhenSenderStalls) {
  const TransferSpec spec = SmallSpec(3);
  const auto layers = RandomLayers(spec, 9);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(19, spec, sink, absl::Milliseconds(400)).ok());
  auto session = sender_->Open(receiver_->endpoint(), 19, spec);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(Send(**session, 19, 0, layers[0]).ok());
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kDeadlineExceeded) << result->status();
  EXPECT_THAT(Msg(result->status()), HasSubstr("1 of 3 layers"));
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_FALSE(sent->ok());
}

TEST_F(TcpTransportTest, ConnectToClosedPortIsUnavailable) {
  std::string endpoint;
  {
    auto closed = TcpKvReceiver::Create("127.0.0.1", 0, dst_.regions());
    ASSERT_TRUE(closed.ok());
    endpoint = (*closed)->endpoint();
  }
  auto session = sender_->Open(endpoint, 1, SmallSpec());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kUnavailable) << session.status();
  EXPECT_THAT(Msg(session.status()), HasSubstr(endpoint));
}

TEST_F(TcpTransportTest, OpenRejectsBadEndpointAndSpec) {
  EXPECT_EQ(sender_->Open("127.0.0.1:80", 1, SmallSpec()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender_->Open(receiver_->endpoint(), 1, SmallSpec(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TcpTransportTest, SendLayerValidatesArguments) {
  const TransferSpec spec = SmallSpec(2);
  const auto layers = RandomLayers(spec, 10);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(20, spec, sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 20, spec);
  ASSERT_TRUE(session.ok());
  const std::vector<int32_t>& table = src_.Table(20, spec.num_tokens);
  auto chunk = [&](int layer, int begin, int count, std::span<const int32_t> blocks) {
    return (*session)->SendLayer(
        {.layer = layer, .token_begin = begin, .num_tokens = count, .block_table = blocks});
  };
  EXPECT_EQ(chunk(2, 0, 8, table).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chunk(-1, 0, 8, table).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chunk(0, 0, 0, table).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chunk(0, 4, 8, table).code(), absl::StatusCode::kInvalidArgument);  // past the end
  EXPECT_EQ(chunk(0, 4, 4, table).code(), absl::StatusCode::kInvalidArgument);  // skips [0, 4)
  // A table that does not cover the tokens, or names a block that is not there.
  EXPECT_EQ(chunk(0, 0, 8, std::span(table).first(1)).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_block = {table[0], 9999};
  EXPECT_EQ(chunk(0, 0, 8, bad_block).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Send(**session, 20, 0, layers[0]).ok());
  EXPECT_EQ(Send(**session, 20, 0, layers[0]).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(Send(**session, 20, 1, layers[1]).ok());
  DoneWaiter done;
  (*session)->Finish(3, done.Callback());
  EXPECT_EQ(Send(**session, 20, 1, layers[1]).code(), absl::StatusCode::kFailedPrecondition);
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;  // rejected calls did not disturb the transfer
}

TEST_F(TcpTransportTest, ExpectValidatesArguments) {
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_EQ(Expect(1, SmallSpec(0), sink, kWait).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Expect(1, SmallSpec(), nullptr, kWait).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Expect(1, SmallSpec(), sink, absl::ZeroDuration()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Expect(1, SmallSpec(), sink, kWait).ok());
  EXPECT_EQ(Expect(1, SmallSpec(), std::make_shared<RecordingSink>(), kWait).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(TcpTransportTest, SixteenConcurrentTransfersThroughOneReceiver) {
  constexpr int kTransfers = 16;
  const TransferSpec spec = SmallSpec(8, 64);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<std::vector<std::vector<std::byte>>> payloads;
  for (int i = 0; i < kTransfers; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    payloads.push_back(RandomLayers(spec, 100 + i));
    ASSERT_TRUE(Expect(1000 + i, spec, sinks[i], absl::Seconds(10)).ok());
  }
  std::vector<DoneWaiter> dones(kTransfers);
  std::vector<absl::Status> open_status(kTransfers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kTransfers; ++i) {
    threads.emplace_back([&, i] {
      auto session = sender_->Open(receiver_->endpoint(), 1000 + i, spec);
      if (!session.ok()) {
        open_status[i] = session.status();
        return;
      }
      std::vector<int> order = InOrder(spec.num_layers);
      std::rotate(order.begin(), order.begin() + i % spec.num_layers, order.end());
      open_status[i] = SendAll(**session, 1000 + i, payloads[i], order);
      (*session)->Finish(i, dones[i].Callback());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kTransfers; ++i) {
    ASSERT_TRUE(open_status[i].ok()) << i << ": " << open_status[i];
    auto sent = dones[i].Wait(absl::Seconds(10));
    ASSERT_TRUE(sent.has_value()) << i;
    EXPECT_TRUE(sent->ok()) << i << ": " << *sent;
    auto result = sinks[i]->WaitResult();
    ASSERT_TRUE(result.has_value()) << i;
    ASSERT_TRUE(result->ok()) << i << ": " << result->status();
    EXPECT_EQ(**result, i);
    ExpectReceivedExactly(*sinks[i], payloads[i]);
  }
}

TEST_F(TcpTransportTest, DestroyingReceiverCompletesEveryPendingSink) {
  const TransferSpec spec = SmallSpec(3);
  const auto layers = RandomLayers(spec, 11);
  auto connected = std::make_shared<RecordingSink>();
  auto idle_a = std::make_shared<RecordingSink>();
  auto idle_b = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(21, spec, connected, kWait).ok());
  ASSERT_TRUE(Expect(22, spec, idle_a, kWait).ok());
  ASSERT_TRUE(Expect(23, spec, idle_b, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 21, spec);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(Send(**session, 21, 0, layers[0]).ok());
  ASSERT_TRUE(connected->WaitLayers(1));

  receiver_.reset();  // joins everything; every sink has completed on return
  for (auto* sink : {connected.get(), idle_a.get(), idle_b.get()}) {
    auto result = sink->WaitResult(absl::ZeroDuration());
    ASSERT_TRUE(result.has_value());
    EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled) << result->status();
    EXPECT_EQ(sink->complete_calls(), 1);
  }
  DoneWaiter done;
  Send(**session, 21, 1, layers[1]).IgnoreError();
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_FALSE(sent->ok());
}

TEST_F(TcpTransportTest, SinkErrorFailsBothSides) {
  const TransferSpec spec = SmallSpec(4);
  const auto layers = RandomLayers(spec, 12);
  auto sink = std::make_shared<RecordingSink>(/*fail_on_layer=*/1);
  ASSERT_TRUE(Expect(24, spec, sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 24, spec);
  ASSERT_TRUE(session.ok());
  for (int i = 0; i < spec.num_layers; ++i) Send(**session, 24, i, layers[i]).IgnoreError();
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kResourceExhausted) << result->status();
  EXPECT_THAT(Msg(result->status()), HasSubstr("no free KV blocks"));
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_FALSE(sent->ok());
  EXPECT_THAT(Msg(*sent), HasSubstr("no free KV blocks"));
  EXPECT_EQ(sink->layers_after_complete(), 0);
}

TEST_F(TcpTransportTest, SessionMayBeDestroyedInsideDone) {
  const TransferSpec spec = SmallSpec(2);
  const auto layers = RandomLayers(spec, 13);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(25, spec, sink, kWait).ok());
  auto opened = sender_->Open(receiver_->endpoint(), 25, spec);
  ASSERT_TRUE(opened.ok());
  std::shared_ptr<SendSession> session = std::move(*opened);
  ASSERT_TRUE(SendAll(*session, 25, layers, InOrder(2)).ok());
  DoneWaiter done;
  auto notify = done.Callback();
  std::shared_ptr<SendSession> self = session;
  session->Finish(5, [self = std::move(self), notify](absl::Status s) mutable {
    self.reset();  // last reference: the session dies on the writer thread
    notify(s);
  });
  session.reset();
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
}

TEST_F(TcpTransportTest, DestroyingSenderFailsInFlightTransfers) {
  // A listener that never accepts: the handshake ACK never comes, and the
  // handshake timeout is longer than the test may run: the destructor must
  // fail the transfer itself, not wait for the timeout.
  sender_ = MakeSender(src_.regions(), NeverTimingOutSenderOptions());
  auto silent = tcp::Listener::Create("127.0.0.1", 0);
  ASSERT_TRUE(silent.ok());
  const std::string endpoint = tcp::FormatTcpEndpoint("127.0.0.1", (*silent)->port());
  auto session = sender_->Open(endpoint, 26, SmallSpec());
  ASSERT_TRUE(session.ok()) << session.status();
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  sender_.reset();
  auto sent = done.Wait(absl::ZeroDuration());
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->code(), absl::StatusCode::kUnavailable) << *sent;
  EXPECT_THAT(Msg(*sent), HasSubstr("shutting down"));
  session->reset();  // outliving the sender is safe
}

TEST_F(TcpTransportTest, HandshakeTimeoutFailsSender) {
  auto silent = tcp::Listener::Create("127.0.0.1", 0);
  ASSERT_TRUE(silent.ok());
  TcpSenderOptions options = FastSenderOptions();
  options.handshake_timeout = absl::Milliseconds(300);
  auto sender = MakeSender(src_.regions(), options);
  auto session =
      sender->Open(tcp::FormatTcpEndpoint("127.0.0.1", (*silent)->port()), 27, SmallSpec());
  ASSERT_TRUE(session.ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->code(), absl::StatusCode::kDeadlineExceeded) << *sent;
}

// ---- Raw wire-level peers ----

std::shared_ptr<tcp::Connection> RawConnect(const std::string& endpoint) {
  auto to = tcp::ParseTcpEndpoint(endpoint);
  if (!to.ok()) return nullptr;
  auto conn = tcp::Connection::Connect(*to, absl::Now() + kWait);
  return conn.ok() ? *conn : nullptr;
}

absl::Status RawHandshake(tcp::Connection& conn, TransferId id, const TransferSpec& spec) {
  const std::string header = MakeHeader(id, spec).SerializeAsString();
  absl::Status s =
      tcp::WriteFrame(conn, tcp::FrameType::kHeader, std::as_bytes(std::span<const char>(header)),
                      absl::Now() + kWait);
  if (!s.ok()) return s;
  auto ack = tcp::ReadAckFrame(conn, absl::Now() + kWait);
  if (!ack.ok()) return ack.status();
  return ack->ok() ? absl::OkStatus() : absl::FailedPreconditionError(ack->error());
}

absl::Status WriteRaw(tcp::Connection& conn, std::span<const std::byte> bytes) {
  const std::span<const std::byte> parts[] = {bytes};
  return conn.WriteAll(parts, absl::Now() + kWait);
}

struct GarbageCase {
  const char* name;
  // Writes what follows a successful handshake (spec: SmallSpec(2)).
  void (*write)(tcp::Connection& conn, const TransferSpec& spec);
  absl::StatusCode code;
  const char* message;
};

class MalformedFrameTest : public TcpTransportTest,
                           public ::testing::WithParamInterface<GarbageCase> {};

TEST_P(MalformedFrameTest, FailsTransferCleanly) {
  const TransferSpec spec = SmallSpec(2);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(30, spec, sink, kWait).ok());
  auto conn = RawConnect(receiver_->endpoint());
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(RawHandshake(*conn, 30, spec).ok());
  GetParam().write(*conn, spec);

  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value()) << "receiver did not fail the transfer";
  EXPECT_EQ(result->status().code(), GetParam().code) << result->status();
  EXPECT_THAT(Msg(result->status()), HasSubstr(GetParam().message));
  // The receiver explains itself to the peer before closing.
  auto ack = tcp::ReadAckFrame(*conn, absl::Now() + kWait);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_FALSE(ack->ok());
  EXPECT_THAT(ack->error(), HasSubstr(GetParam().message));
  EXPECT_EQ(sink->complete_calls(), 1);

  // The receiver is still healthy afterwards.
  const auto layers = RandomLayers(spec, 14);
  auto good_sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(31, spec, good_sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 31, spec);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(SendAll(**session, 31, layers, InOrder(2)).ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
}

void WriteLayer(tcp::Connection& conn, const TransferSpec& spec, uint32_t index) {
  std::vector<std::byte> payload(spec.LayerBytes(), std::byte{0x5a});
  ASSERT_TRUE(
      tcp::WriteLayerFrame(conn, static_cast<int>(index), payload, absl::Now() + kWait).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Garbage, MalformedFrameTest,
    ::testing::Values(
        GarbageCase{"UnknownType",
                    [](tcp::Connection& c, const TransferSpec&) {
                      const auto h = tcp::EncodeFrameHeader(static_cast<tcp::FrameType>(99), 0);
                      ASSERT_TRUE(WriteRaw(c, h).ok());
                    },
                    absl::StatusCode::kInvalidArgument, "unknown kv frame type 99"},
        GarbageCase{"HugeLength",
                    [](tcp::Connection& c, const TransferSpec&) {
                      const auto h = tcp::EncodeFrameHeader(tcp::FrameType::kLayer, ~uint64_t{0});
                      ASSERT_TRUE(WriteRaw(c, h).ok());
                    },
                    absl::StatusCode::kInvalidArgument, "LAYER frame length"},
        GarbageCase{"WrongLayerSize",
                    [](tcp::Connection& c, const TransferSpec&) {
                      const auto h = tcp::EncodeFrameHeader(tcp::FrameType::kLayer, 4 + 10);
                      ASSERT_TRUE(WriteRaw(c, h).ok());
                    },
                    absl::StatusCode::kInvalidArgument, "LAYER frame of 14 bytes"},
        GarbageCase{"LayerOutOfRange",
                    [](tcp::Connection& c, const TransferSpec& spec) { WriteLayer(c, spec, 77); },
                    absl::StatusCode::kInvalidArgument, "layer index 77 out of range"},
        GarbageCase{"DuplicateLayer",
                    [](tcp::Connection& c, const TransferSpec& spec) {
                      WriteLayer(c, spec, 0);
                      WriteLayer(c, spec, 0);
                    },
                    absl::StatusCode::kInvalidArgument, "duplicate layer 0"},
        GarbageCase{"FinishWithMissingLayer",
                    [](tcp::Connection& c, const TransferSpec& spec) {
                      WriteLayer(c, spec, 1);
                      ASSERT_TRUE(tcp::WriteFinishFrame(c, 1, absl::Now() + kWait).ok());
                    },
                    absl::StatusCode::kFailedPrecondition, "layer 0 missing"},
        GarbageCase{"HeaderAfterHandshake",
                    [](tcp::Connection& c, const TransferSpec& spec) {
                      const std::string h = MakeHeader(30, spec).SerializeAsString();
                      ASSERT_TRUE(tcp::WriteFrame(c, tcp::FrameType::kHeader,
                                                  std::as_bytes(std::span<const char>(h)),
                                                  absl::Now() + kWait)
                                      .ok());
                    },
                    absl::StatusCode::kInvalidArgument, "unexpected HEADER frame"},
        GarbageCase{"TruncatedLayerThenClose",
                    [](tcp::Connection& c, const TransferSpec& spec) {
                      const auto h =
                          tcp::EncodeFrameHeader(tcp::FrameType::kLayer, 4 + spec.LayerBytes());
                      ASSERT_TRUE(WriteRaw(c, h).ok());
                      const std::byte partial[10] = {};
                      ASSERT_TRUE(WriteRaw(c, partial).ok());
                      c.ShutdownWrite();
                    },
                    absl::StatusCode::kUnavailable, "connection closed by peer"},
        GarbageCase{"InvalidUtf8Abort",
                    [](tcp::Connection& c, const TransferSpec&) {
                      const char msg[] = "bad \xff\xfe bytes";
                      ASSERT_TRUE(tcp::WriteFrame(
                                      c, tcp::FrameType::kAbort,
                                      std::as_bytes(std::span<const char>(msg, sizeof(msg) - 1)),
                                      absl::Now() + kWait)
                                      .ok());
                    },
                    absl::StatusCode::kAborted, "bad ?? bytes"}),
    [](const ::testing::TestParamInfo<GarbageCase>& info) { return info.param.name; });

// With a cluster token, a header without its digest (or with another
// token's) is refused before the transfer id is looked at: the expected
// transfer neither fails nor is claimed, and the real sender then completes it.
TEST_F(TcpTransportTest, HandshakeWithoutTheClusterCredentialChangesNothing) {
  const TransferSpec spec = SmallSpec(2);
  const auto layers = RandomLayers(spec, 9);
  struct ClearToken {
    ~ClearToken() { SetClusterToken(""); }
  } clear_token;  // also when an assertion returns early
  SetClusterToken("other-cluster");
  internal::v1::KvTransferHeader foreign = MakeHeader(41, spec);
  SetClusterToken("kv-test-token");
  internal::v1::KvTransferHeader missing = MakeHeader(41, spec);
  missing.clear_cluster_credential();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(41, spec, sink, kWait).ok());
  for (const internal::v1::KvTransferHeader& header : {missing, foreign}) {
    auto conn = RawConnect(receiver_->endpoint());
    ASSERT_NE(conn, nullptr);
    const std::string bytes = header.SerializeAsString();
    ASSERT_TRUE(tcp::WriteFrame(*conn, tcp::FrameType::kHeader,
                                std::as_bytes(std::span<const char>(bytes)), absl::Now() + kWait)
                    .ok());
    auto ack = tcp::ReadAckFrame(*conn, absl::Now() + kWait);
    ASSERT_TRUE(ack.ok()) << ack.status();
    EXPECT_FALSE(ack->ok());
    EXPECT_THAT(ack->error(), HasSubstr("cluster credential"));
  }
  EXPECT_EQ(sink->complete_calls(), 0);

  auto session = sender_->Open(receiver_->endpoint(), 41, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(SendAll(**session, 41, layers, InOrder(spec.num_layers)).ok());
  DoneWaiter done;
  (*session)->Finish(5, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  ExpectReceivedExactly(*sink, layers);
}

TEST_F(TcpTransportTest, GarbageBeforeHeaderIsRefusedWithoutHarm) {
  auto conn = RawConnect(receiver_->endpoint());
  ASSERT_NE(conn, nullptr);
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(WriteRaw(*conn, std::as_bytes(std::span<const char>(junk, sizeof(junk) - 1))).ok());
  auto ack = tcp::ReadAckFrame(*conn, absl::Now() + kWait);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_FALSE(ack->ok());
  EXPECT_THAT(ack->error(), HasSubstr("unknown kv frame type"));
}

TEST_F(TcpTransportTest, SilentConnectionDoesNotBlockOthers) {
  auto idle = RawConnect(receiver_->endpoint());  // connects, never speaks
  ASSERT_NE(idle, nullptr);
  const TransferSpec spec = SmallSpec(2);
  const auto layers = RandomLayers(spec, 15);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(32, spec, sink, kWait).ok());
  auto session = sender_->Open(receiver_->endpoint(), 32, spec);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(SendAll(**session, 32, layers, InOrder(2)).ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
}

// Sends transfer `id` (SmallSpec, every layer) from `src` through `sender`
// to `receiver` and returns how it ended.
absl::Status SendSmall(Side& src, KvSender& sender, KvReceiver& receiver, TransferId id) {
  const TransferSpec spec = SmallSpec();
  auto session = sender.Open(receiver.endpoint(), id, spec);
  if (!session.ok()) return session.status();
  const auto layers = RandomLayers(spec, static_cast<int>(id));
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    const int tokens = static_cast<int>(layers[layer].size() / (2 * spec.TokenBytes()));
    if (absl::Status s = testing::SendPayload(**session, src, id, layer, layers[layer], tokens);
        !s.ok()) {
      return s;
    }
  }
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  return sent.has_value() ? *sent : absl::DeadlineExceededError("no outcome");
}

// True once the receiver closed `conn` (EOF or an error), within kWait.
bool ClosedByPeer(tcp::Connection& conn) {
  std::array<std::byte, 256> buf;
  const absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline) {
    absl::Status s = conn.ReadExact(buf, deadline);
    if (!s.ok()) return !absl::IsDeadlineExceeded(s);
  }
  return false;
}

TEST_F(TcpTransportTest, IdleStrangersHoldNoSlot) {
  TcpReceiverOptions options = FastReceiverOptions();
  options.max_connections = 1;
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_.regions(), options);
  ASSERT_TRUE(receiver.ok());
  // Connected, saying nothing: they wait without a handler thread.
  std::vector<std::shared_ptr<tcp::Connection>> strangers;
  for (int i = 0; i < 5; ++i) {
    strangers.push_back(RawConnect((*receiver)->endpoint()));
    ASSERT_NE(strangers.back(), nullptr);
  }
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(33, SmallSpec(), sink, kWait, receiver->get()).ok());
  const absl::Status sent = SendSmall(src_, *sender_, **receiver, 33);
  EXPECT_TRUE(sent.ok()) << sent;
  EXPECT_EQ((*receiver)->connections_evicted(), 0);
  EXPECT_EQ((*receiver)->connections_refused(), 0);
  // Each is closed at its handshake deadline, told why.
  for (auto& stranger : strangers) {
    auto ack = tcp::ReadAckFrame(*stranger, absl::Now() + kWait);
    ASSERT_TRUE(ack.ok()) << ack.status();
    EXPECT_FALSE(ack->ok());
    EXPECT_THAT(ack->error(), HasSubstr("no HEADER within"));
    EXPECT_TRUE(ClosedByPeer(*stranger));
  }
}

TEST_F(TcpTransportTest, AStrangerMidHandshakeGivesItsSlotToASender) {
  TcpReceiverOptions options = FastReceiverOptions();
  options.max_connections = 1;
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_.regions(), options);
  ASSERT_TRUE(receiver.ok());
  // A few bytes of a frame header, then nothing: it holds the only handler.
  auto stranger = RawConnect((*receiver)->endpoint());
  ASSERT_NE(stranger, nullptr);
  const std::array<std::byte, 3> partial = {std::byte{1}, std::byte{0}, std::byte{0}};
  ASSERT_TRUE(WriteRaw(*stranger, partial).ok());
  absl::SleepFor(absl::Milliseconds(100));  // it reached its handler (or soon will)
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(34, SmallSpec(), sink, kWait, receiver->get()).ok());
  const absl::Status sent = SendSmall(src_, *sender_, **receiver, 34);
  EXPECT_TRUE(sent.ok()) << sent;
  EXPECT_TRUE(ClosedByPeer(*stranger));
  EXPECT_EQ((*receiver)->connections_refused(), 0);
}

TEST_F(TcpTransportTest, AnAuthenticatedTransferIsNeverEvictedForANewcomer) {
  TcpReceiverOptions options = FastReceiverOptions();
  options.max_connections = 1;
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_.regions(), options);
  ASSERT_TRUE(receiver.ok());
  // The only slot: a transfer whose handshake succeeded and whose layers
  // are still to come.
  const TransferSpec spec = SmallSpec(2);
  const auto layers = RandomLayers(spec, 21);
  auto held_sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(35, spec, held_sink, kWait, receiver->get()).ok());
  auto held = sender_->Open((*receiver)->endpoint(), 35, spec);
  ASSERT_TRUE(held.ok());
  // The newcomer finds every slot authenticated and is refused.
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(36, SmallSpec(), sink, kWait, receiver->get()).ok());
  std::unique_ptr<KvSender> other = MakeSender(src_.regions());
  const absl::Status refused = SendSmall(src_, *other, **receiver, 36);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(Msg(refused), HasSubstr("capacity"));
  EXPECT_EQ((*receiver)->connections_evicted(), 0);
  EXPECT_EQ((*receiver)->connections_refused(), 1);
  // The held transfer was not disturbed.
  ASSERT_TRUE(SendAll(**held, 35, layers, InOrder(2)).ok());
  DoneWaiter done;
  (*held)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  ExpectReceivedExactly(*held_sink, layers);
}

TEST_F(TcpTransportTest, StrangersFromOneAddressHoldFewSlotsAndSendersGetThrough) {
  TcpReceiverOptions options = FastReceiverOptions();
  options.max_connections = 16;
  options.max_unauthenticated_per_source = 4;
  options.max_waiting_connections = 64;
  options.max_waiting_per_source = 8;
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_.regions(), options);
  ASSERT_TRUE(receiver.ok());
  // 40 silent strangers (at most 8 may wait) and 10 that send a byte and
  // stall (at most 4 may hold a handler), all from this address.
  std::vector<std::shared_ptr<tcp::Connection>> strangers;
  for (int i = 0; i < 40; ++i) {
    strangers.push_back(RawConnect((*receiver)->endpoint()));
    ASSERT_NE(strangers.back(), nullptr);
  }
  const std::array<std::byte, 1> one = {std::byte{1}};
  for (int i = 0; i < 10; ++i) {
    strangers.push_back(RawConnect((*receiver)->endpoint()));
    ASSERT_NE(strangers.back(), nullptr);
    ASSERT_TRUE(WriteRaw(*strangers.back(), one).ok());
  }
  // Transfers from the same address (loopback) still get through, one after
  // another on fresh connections.
  for (TransferId id = 40; id < 44; ++id) {
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(Expect(id, SmallSpec(), sink, kWait, receiver->get()).ok());
    std::unique_ptr<KvSender> sender = MakeSender(src_.regions());
    const absl::Status sent = SendSmall(src_, *sender, **receiver, id);
    EXPECT_TRUE(sent.ok()) << id << ": " << sent;
  }
  // 32 silent ones were closed at once; at least 6 talkers were too,
  // unless some passed their handshake deadline first.
  EXPECT_GE((*receiver)->connections_evicted(), 32);
  int closed = 0;
  for (auto& s : strangers) closed += ClosedByPeer(*s) ? 1 : 0;
  EXPECT_EQ(closed, 50);  // the rest by the handshake deadline
}

TEST_F(TcpTransportTest, SilentConnectionIsClosedAtTheHandshakeDeadline) {
  TcpReceiverOptions options = FastReceiverOptions();
  options.handshake_timeout = absl::Milliseconds(200);
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_.regions(), options);
  ASSERT_TRUE(receiver.ok());
  auto silent = RawConnect((*receiver)->endpoint());
  ASSERT_NE(silent, nullptr);
  // The receiver answers ACK{false} (deadline) and closes.
  auto ack = tcp::ReadAckFrame(*silent, absl::Now() + kWait);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_FALSE(ack->ok());
  EXPECT_TRUE(ClosedByPeer(*silent));
  // So does one that started a frame and stalled (in its handler).
  auto stalled = RawConnect((*receiver)->endpoint());
  ASSERT_NE(stalled, nullptr);
  const std::array<std::byte, 2> partial = {std::byte{1}, std::byte{0}};
  ASSERT_TRUE(WriteRaw(*stalled, partial).ok());
  EXPECT_TRUE(ClosedByPeer(*stalled));
}

TEST_F(TcpTransportTest, SenderMayBeDestroyedInsideDone) {
  const TransferSpec spec = SmallSpec(2);
  const auto layers = RandomLayers(spec, 17);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(34, spec, sink, kWait).ok());
  std::shared_ptr<KvSender> sender = MakeSender(src_.regions());
  auto session = sender->Open(receiver_->endpoint(), 34, spec);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(SendAll(**session, 34, layers, InOrder(2)).ok());
  DoneWaiter done;
  auto notify = done.Callback();
  (*session)->Finish(3, [owner = sender, notify](absl::Status s) mutable {
    owner.reset();  // the last reference: the sender dies on its own writer thread
    notify(s);
  });
  sender.reset();
  session->reset();
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
}

// A peer that answers the handshake, reads frames through FINISH and then
// never sends the final ACK; it exits when the sender closes (or after kWait).
class NoFinalAckReceiver {
 public:
  NoFinalAckReceiver() {
    auto listener = tcp::Listener::Create("127.0.0.1", 0);
    if (listener.ok()) listener_ = std::move(*listener);
    thread_ = std::thread([this] { Run(); });
  }
  ~NoFinalAckReceiver() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      if (conn_ != nullptr) conn_->Shutdown();
    }
    thread_.join();
  }
  std::string endpoint() const {
    return tcp::FormatTcpEndpoint("127.0.0.1", listener_ ? listener_->port() : 1);
  }
  bool saw_finish() {
    absl::MutexLock l(&mu_);
    return saw_finish_;
  }

 private:
  void Run() {
    if (listener_ == nullptr) return;
    std::shared_ptr<tcp::Connection> conn;
    const absl::Time deadline = absl::Now() + kWait;
    while (conn == nullptr && absl::Now() < deadline) {
      auto accepted = listener_->Accept();
      if (!accepted.ok()) return;
      conn = *accepted;
      if (conn == nullptr) absl::SleepFor(absl::Milliseconds(5));
    }
    if (conn == nullptr) return;
    {
      absl::MutexLock l(&mu_);
      if (stop_) return;
      conn_ = conn;
    }
    auto header = tcp::ReadFrameHeader(*conn, deadline);
    if (!header.ok() || !tcp::ReadControlPayload(*conn, *header, deadline).ok()) return;
    if (!tcp::WriteAckFrame(*conn, absl::OkStatus(), deadline).ok()) return;
    while (true) {
      auto frame = tcp::ReadFrameHeader(*conn, deadline);
      if (!frame.ok()) return;
      std::vector<std::byte> payload(frame->length);
      if (!conn->ReadExact(payload, deadline).ok()) return;
      if (frame->type == tcp::FrameType::kFinish) break;
    }
    {
      absl::MutexLock l(&mu_);
      saw_finish_ = true;
    }
    conn->WaitReadable(deadline, nullptr).IgnoreError();  // until the sender closes
  }

  std::unique_ptr<tcp::Listener> listener_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool saw_finish_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<tcp::Connection> conn_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

TEST_F(TcpTransportTest, MissingFinalAckTimesOut) {
  NoFinalAckReceiver peer;
  TcpSenderOptions options = FastSenderOptions();
  options.final_ack_timeout = absl::Milliseconds(300);
  auto sender = MakeSender(src_.regions(), options);
  const TransferSpec spec = SmallSpec(1);
  auto session = sender->Open(peer.endpoint(), 35, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(Send(**session, 35, 0, RandomLayers(spec, 18)[0]).ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->code(), absl::StatusCode::kDeadlineExceeded) << *sent;
  EXPECT_THAT(Msg(*sent), HasSubstr("final ACK"));
  EXPECT_TRUE(peer.saw_finish());
}

TEST_F(TcpTransportTest, AbortAfterFinishStopsWaitingForFinalAck) {
  NoFinalAckReceiver peer;
  // The final ACK's timeout outlasts the test: only the abort can end it.
  sender_ = MakeSender(src_.regions(), NeverTimingOutSenderOptions());
  const TransferSpec spec = SmallSpec(1);
  auto session = sender_->Open(peer.endpoint(), 36, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(Send(**session, 36, 0, RandomLayers(spec, 19)[0]).ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  ASSERT_TRUE(pdserve::testing::PollUntil([&] { return peer.saw_finish(); }));
  (*session)->Abort(absl::CancelledError("request cancelled by the client"));
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value()) << "done never came after the abort";
  EXPECT_EQ(sent->code(), absl::StatusCode::kCancelled) << *sent;
  EXPECT_THAT(Msg(*sent), HasSubstr("request cancelled by the client"));
}

TEST_F(TcpTransportTest, DestroyingSenderDuringFinalAckFailsDone) {
  NoFinalAckReceiver peer;
  const TransferSpec spec = SmallSpec(1);
  auto session = sender_->Open(peer.endpoint(), 37, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(Send(**session, 37, 0, RandomLayers(spec, 20)[0]).ok());
  DoneWaiter done;
  (*session)->Finish(1, done.Callback());
  session->reset();
  ASSERT_TRUE(pdserve::testing::PollUntil([&] { return peer.saw_finish(); }));
  sender_.reset();
  auto sent = done.Wait(absl::ZeroDuration());
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->code(), absl::StatusCode::kUnavailable) << *sent;
  EXPECT_THAT(Msg(*sent), HasSubstr("shutting down"));
}

TEST_F(TcpTransportTest, WorksOverIpv6Loopback) {
  auto receiver = TcpKvReceiver::Create("::1", 0, dst_.regions(), FastReceiverOptions());
  if (!receiver.ok()) GTEST_SKIP() << "no IPv6 loopback: " << receiver.status();
  EXPECT_THAT((*receiver)->endpoint(), ::testing::StartsWith("tcp://[::1]:"));
  auto sender = MakeSender(src_.regions());
  const TransferSpec spec = SmallSpec(3);
  const auto layers = RandomLayers(spec, 16);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Expect(40, spec, sink, kWait, receiver->get()).ok());
  auto session = sender->Open((*receiver)->endpoint(), 40, spec);
  if (!session.ok() && absl::IsUnavailable(session.status())) {
    GTEST_SKIP() << "IPv6 loopback not connectable: " << session.status();
  }
  ASSERT_TRUE(session.ok()) << session.status();
  for (int i = 0; i < spec.num_layers; ++i) ASSERT_TRUE(Send(**session, 40, i, layers[i]).ok());
  DoneWaiter done;
  (*session)->Finish(9, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  EXPECT_EQ(**result, 9);
  EXPECT_TRUE(sink->layers()[2] == layers[2]);
}

}  // namespace
}  // namespace pdserve::kvtransfer
