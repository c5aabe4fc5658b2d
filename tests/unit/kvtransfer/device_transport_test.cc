// The device transport (kvtransfer/device/) end to end in one process: a
// DeviceKvSender and a DeviceKvReceiver on loopback gRPC, KV in device
// regions with different block sizes and shuffled block ids on each side,
// over both data planes (NCCL, and CUDA IPC for a pair on one GPU), and its
// faults with scripted peers speaking the control protocol by hand: a
// receiver that never posts its receive, a communicator that fails, a
// sender that never sends what it announced, a receiver that goes away.
// Every fault must end in a clear status on both sides with every block
// freed, within bounded time.
//
// Under the emulation both ends share the one emulated device; on GPUs the
// NCCL cases need two devices (NCCL refuses two ranks on one) and skip
// otherwise.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/grpc_util.h"
#include "device_test_util.h"
#include "gmock/gmock.h"
#include "kvtransfer/device/cuda_staging.h"
#include "kvtransfer/device/device_receiver.h"
#include "kvtransfer/device/device_sender.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "tests/unit/cuda/gpu_test_util.h"
#include "tests/util/poll.h"

namespace pdserve::kvtransfer::device {
namespace {

using internal::v1::KvPairRequest;
using internal::v1::KvPairResponse;
using kvtransfer::testing::DeviceKv;
using Side = kvtransfer::testing::DeviceSide;
using kvtransfer::testing::DoneWaiter;
using kvtransfer::testing::kWait;
using kvtransfer::testing::RandomLayers;
using kvtransfer::testing::RecordingSink;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TransferSpec Shape(int num_tokens = 24) {
  TransferSpec s = kvtransfer::testing::PeerShape();
  s.num_tokens = num_tokens;
  return s;
}

DeviceTransportOptions FastOptions(bool allow_ipc, int device) {
  DeviceTransportOptions o;
  o.device = device;
  o.allow_ipc = allow_ipc;
  o.max_chunk_bytes = 640;  // 10 tokens of 64 bytes: most chunks take several messages
  o.stall_timeout = absl::Seconds(3);
  o.watchdog_interval = absl::Milliseconds(10);
  o.connect_timeout = absl::Seconds(10);
  o.abort_grace = absl::Seconds(1);
  return o;
}

bool Emulated() {
#if defined(PDSERVE_GPU_EMULATION)
  return true;
#else
  return false;
#endif
}

// Frees the destination blocks once the transfer completes.
class FreeingSink final : public ReceiveSink {
 public:
  FreeingSink(std::shared_ptr<RecordingSink> inner, Side* side, TransferId id)
      : inner_(std::move(inner)), side_(side), id_(id) {}
  absl::Status OnLayer(int layer, int begin, int count) override {
    return inner_->OnLayer(layer, begin, count);
  }
  void OnComplete(absl::StatusOr<int32_t> first_token) override {
    side_->Release(id_);
    inner_->OnComplete(std::move(first_token));
  }

 private:
  const std::shared_ptr<RecordingSink> inner_;
  Side* const side_;
  const TransferId id_;
};

class DeviceTransportTest : public cuda::testing::GpuTest,
                            public ::testing::WithParamInterface<const char*> {
 protected:
  bool ipc() const { return std::string(GetParam()) == "ipc"; }

  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    // NCCL needs its two ranks on two GPUs; IPC one GPU for both.
    if (!ipc() && !Emulated() && count < 2) GTEST_SKIP() << "NCCL needs two GPUs";
    receiver_device_ = ipc() || Emulated() ? 0 : 1;
    src_ = std::make_unique<Side>(Shape(), 256, 5, 11, 0);
    dst_ = std::make_unique<Side>(Shape(), 256, 3, 12, receiver_device_);
    auto receiver = DeviceKvReceiver::Create("127.0.0.1", 0, dst_->kv().regions(),
                                             FastOptions(ipc(), receiver_device_));
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = std::move(*receiver);
    auto sender = DeviceKvSender::Create(src_->kv().regions(), FastOptions(ipc(), 0));
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = std::move(*sender);
  }
  void TearDown() override {
    // A SetUp that failed (no device where one is required) built nothing.
    if (!IsSkipped() && src_ != nullptr && dst_ != nullptr) {
      sender_.reset();
      receiver_.reset();
      // Nothing leaked on either side.
      EXPECT_EQ(src_->blocks_in_use(), 0);
      EXPECT_EQ(dst_->blocks_in_use(), 0);
    }
    GpuTest::TearDown();
  }

  // Expects transfer `id` into fresh destination blocks.
  std::shared_ptr<RecordingSink> Expect(TransferId id, const TransferSpec& spec,
                                        absl::Duration timeout = kWait,
                                        KvReceiver* receiver = nullptr) {
    auto sink = std::make_shared<RecordingSink>();
    const std::vector<int32_t> table = dst_->Table(id, spec.num_tokens);
    sink->Watch([this, table,
                 n = spec.num_tokens](int layer) { return dst_->kv().ReadLayer(layer, table, n); },
                spec.num_tokens);
    const absl::Status s =
        (receiver != nullptr ? receiver : receiver_.get())
            ->Expect(id, spec, table, std::make_shared<FreeingSink>(sink, dst_.get(), id), timeout);
    EXPECT_TRUE(s.ok()) << s;
    return sink;
  }
  // Writes the payloads into transfer `id`'s source blocks.
  void Stage(TransferId id, const TransferSpec& spec,
             const std::vector<std::vector<std::byte>>& layers) {
    const std::vector<int32_t>& table = src_->Table(id, spec.num_tokens);
    for (int i = 0; i < spec.num_layers; ++i) src_->kv().WriteLayer(i, table, layers[i]);
  }
  absl::Status Send(SendSession& session, TransferId id, const TransferSpec& spec, int layer,
                    int begin, int count, void* event = nullptr) {
    return session.SendLayer({.layer = layer,
                              .token_begin = begin,
                              .num_tokens = count,
                              .block_table = src_->Table(id, spec.num_tokens),
                              .ready_event = event});
  }
  // Finish with a callback that frees the source blocks.
  void Finish(SendSession& session, TransferId id, int32_t token, DoneWaiter& done) {
    auto notify = done.Callback();
    session.Finish(token, [this, id, notify](absl::Status s) {
      src_->Release(id);
      notify(s);
    });
  }

  int receiver_device_ = 0;
  std::unique_ptr<Side> src_;
  std::unique_ptr<Side> dst_;
  std::unique_ptr<DeviceKvReceiver> receiver_;
  std::unique_ptr<DeviceKvSender> sender_;
};

TEST_P(DeviceTransportTest, ManyTransfersOnOnePairAreByteExactAcrossLayouts) {
  constexpr int kTransfers = 5;
  const TransferSpec spec = Shape();
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<std::vector<std::vector<std::byte>>> payloads;
  std::vector<std::unique_ptr<SendSession>> sessions;
  for (int i = 0; i < kTransfers; ++i) {
    payloads.push_back(RandomLayers(spec, 100 + i));
    Stage(100 + i, spec, payloads[i]);
    sinks.push_back(Expect(100 + i, spec));
    auto session = sender_->Open(receiver_->endpoint(), 100 + i, spec);
    ASSERT_TRUE(session.ok()) << session.status();
    sessions.push_back(std::move(*session));
  }
  EXPECT_EQ(sender_->DataPlaneTo(receiver_->endpoint()), GetParam());
  // Interleaved: every transfer's first chunk of every layer, then the rest
  // (chunk boundaries inside blocks of 5 and 3 tokens).
  for (const auto& [begin, count] : {std::pair{0, 13}, std::pair{13, 11}}) {
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      for (int i = 0; i < kTransfers; ++i) {
        ASSERT_TRUE(Send(*sessions[i], 100 + i, spec, layer, begin, count).ok());
      }
    }
  }
  std::vector<DoneWaiter> dones(kTransfers);
  for (int i = 0; i < kTransfers; ++i) Finish(*sessions[i], 100 + i, 70 + i, dones[i]);
  for (int i = 0; i < kTransfers; ++i) {
    auto sent = dones[i].Wait(absl::Seconds(20));
    ASSERT_TRUE(sent.has_value()) << i;
    EXPECT_TRUE(sent->ok()) << i << ": " << *sent;
    auto result = sinks[i]->WaitResult();
    ASSERT_TRUE(result.has_value()) << i;
    ASSERT_TRUE(result->ok()) << i << ": " << result->status();
    EXPECT_EQ(**result, 70 + i);
    const auto got = sinks[i]->layers();
    ASSERT_EQ(got.size(), static_cast<size_t>(spec.num_layers));
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      EXPECT_TRUE(got.at(layer) == payloads[i][layer]) << "transfer " << i << " layer " << layer;
    }
  }
  EXPECT_EQ(receiver_->live_pairs(), 1);
}

TEST_P(DeviceTransportTest, ReadsEachLayerOnlyAfterItsComputeEvent) {
  // A "compute" stream that is busy first, then writes each layer and
  // records its event; the sends are queued at once, before any of it ran.
  const TransferSpec spec = Shape();
  const auto payloads = RandomLayers(spec, 7);
  auto sink = Expect(7, spec);
  auto session = sender_->Open(receiver_->endpoint(), 7, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->OrdersOnDeviceEvents());
  cudaStream_t compute;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  std::byte* busy = nullptr;
  const size_t busy_bytes = size_t{64} << 20;
  ASSERT_EQ(cudaMalloc(&busy, busy_bytes), cudaSuccess);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(cudaMemsetAsync(busy, i, busy_bytes, compute), cudaSuccess);
  const std::vector<int32_t>& table = src_->Table(7, spec.num_tokens);
  std::vector<cudaEvent_t> events(spec.num_layers);
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    src_->kv().WriteLayer(layer, table, payloads[layer], compute);
    ASSERT_EQ(cudaEventCreateWithFlags(&events[layer], cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(events[layer], compute), cudaSuccess);
    ASSERT_TRUE(Send(**session, 7, spec, layer, 0, spec.num_tokens, events[layer]).ok());
  }
  DoneWaiter done;
  Finish(**session, 7, 5, done);
  auto sent = done.Wait(absl::Seconds(20));
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    EXPECT_TRUE(sink->layers().at(layer) == payloads[layer]) << "layer " << layer;
  }
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  cudaStreamDestroy(compute);
  cudaFree(busy);
}

TEST_P(DeviceTransportTest, SpecMismatchIsRefusedNamingTheField) {
  const TransferSpec expected = Shape();
  TransferSpec sent = expected;
  sent.model_fingerprint ^= 1;
  auto sink = Expect(11, expected);
  auto session = sender_->Open(receiver_->endpoint(), 11, sent);
  ASSERT_TRUE(session.ok()) << session.status();
  Stage(11, sent, RandomLayers(sent, 4));
  Send(**session, 11, sent, 0, 0, sent.num_tokens).IgnoreError();  // may already fail
  DoneWaiter done;
  Finish(**session, 11, 1, done);
  auto got = done.Wait();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), absl::StatusCode::kFailedPrecondition) << *got;
  EXPECT_THAT(Msg(*got), HasSubstr("refused"));
  EXPECT_THAT(Msg(*got), HasSubstr("spec mismatch: model_fingerprint"));
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_THAT(Msg(result->status()), HasSubstr("spec mismatch: model_fingerprint"));
  EXPECT_EQ(sink->layer_calls(), 0);
  // The pair survives a refused transfer.
  EXPECT_EQ(sender_->DataPlaneTo(receiver_->endpoint()), GetParam());
}

TEST_P(DeviceTransportTest, SenderAbortReachesTheReceiver) {
  const TransferSpec spec = Shape();
  auto sink = Expect(13, spec);
  auto session = sender_->Open(receiver_->endpoint(), 13, spec);
  ASSERT_TRUE(session.ok());
  Stage(13, spec, RandomLayers(spec, 6));
  ASSERT_TRUE(Send(**session, 13, spec, 0, 0, spec.num_tokens).ok());
  (*session)->Abort(absl::InternalError("prefill ran out of memory"));
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kAborted) << result->status();
  EXPECT_THAT(Msg(result->status()), HasSubstr("prefill ran out of memory"));
  EXPECT_FALSE(Send(**session, 13, spec, 1, 0, spec.num_tokens).ok());
  DoneWaiter done;
  Finish(**session, 13, 1, done);
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_THAT(Msg(*sent), HasSubstr("prefill ran out of memory"));
}

TEST_P(DeviceTransportTest, ReceiverCancelMidTransferStopsBothSides) {
  const TransferSpec spec = Shape();
  auto sink = Expect(16, spec);
  auto session = sender_->Open(receiver_->endpoint(), 16, spec);
  ASSERT_TRUE(session.ok());
  Stage(16, spec, RandomLayers(spec, 8));
  ASSERT_TRUE(Send(**session, 16, spec, 0, 0, spec.num_tokens).ok());
  ASSERT_TRUE(sink->WaitLayers(1));
  receiver_->Cancel(16);
  auto result = sink->WaitResult(absl::ZeroDuration());  // before Cancel returned
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled) << result->status();
  for (int layer = 1; layer < spec.num_layers; ++layer) {
    Send(**session, 16, spec, layer, 0, spec.num_tokens).IgnoreError();
  }
  DoneWaiter done;
  Finish(**session, 16, 1, done);
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value()) << "sender hung after the receiver cancelled";
  EXPECT_FALSE(sent->ok());
  EXPECT_THAT(Msg(*sent), HasSubstr("cancelled"));
  EXPECT_EQ(sink->complete_calls(), 1);
  EXPECT_EQ(sink->layers_after_complete(), 0);
}

TEST_P(DeviceTransportTest, ExpectTimesOutWhenTheSenderStalls) {
  const TransferSpec spec = Shape();
  // Long enough for the one layer sent to land on a busy machine (400 ms
  // was not, beside a CPU hog).
  auto sink = Expect(19, spec, absl::Seconds(3));
  auto session = sender_->Open(receiver_->endpoint(), 19, spec);
  ASSERT_TRUE(session.ok());
  Stage(19, spec, RandomLayers(spec, 9));
  ASSERT_TRUE(Send(**session, 19, spec, 0, 0, spec.num_tokens).ok());
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kDeadlineExceeded) << result->status();
  EXPECT_THAT(Msg(result->status()), HasSubstr("1 of 4 layers"));
  DoneWaiter done;
  Finish(**session, 19, 1, done);
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_FALSE(sent->ok());
}

TEST_P(DeviceTransportTest, ReceiverGoingAwayMidTransferFailsTheSenderAndReconnects) {
  const TransferSpec spec = Shape();
  auto sink = Expect(21, spec);
  auto session = sender_->Open(receiver_->endpoint(), 21, spec);
  ASSERT_TRUE(session.ok());
  Stage(21, spec, RandomLayers(spec, 11));
  ASSERT_TRUE(Send(**session, 21, spec, 0, 0, spec.num_tokens).ok());
  ASSERT_TRUE(sink->WaitLayers(1));
  receiver_.reset();  // the decode side dies: its pairs fail, its transfers complete
  auto result = sink->WaitResult(absl::ZeroDuration());
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled) << result->status();
  for (int layer = 1; layer < spec.num_layers; ++layer) {
    Send(**session, 21, spec, layer, 0, spec.num_tokens).IgnoreError();
  }
  DoneWaiter done;
  Finish(**session, 21, 1, done);
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value()) << "sender hung after the receiver went away";
  // The receiver's reason when its Ack beats the stream's end, else the end.
  EXPECT_TRUE(absl::IsUnavailable(*sent) || Msg(*sent).find("shutting down") != std::string::npos)
      << *sent;

  // A new receiver: the sender pairs with it and transfers.
  auto receiver = DeviceKvReceiver::Create("127.0.0.1", 0, dst_->kv().regions(),
                                           FastOptions(ipc(), receiver_device_));
  ASSERT_TRUE(receiver.ok());
  receiver_ = std::move(*receiver);
  const auto payloads = RandomLayers(spec, 12);
  Stage(22, spec, payloads);
  auto sink2 = Expect(22, spec);
  auto session2 = sender_->Open(receiver_->endpoint(), 22, spec);
  ASSERT_TRUE(session2.ok()) << session2.status();
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    ASSERT_TRUE(Send(**session2, 22, spec, layer, 0, spec.num_tokens).ok());
  }
  DoneWaiter done2;
  Finish(**session2, 22, 2, done2);
  auto sent2 = done2.Wait();
  ASSERT_TRUE(sent2.has_value());
  EXPECT_TRUE(sent2->ok()) << *sent2;
  EXPECT_TRUE(sink2->layers().at(3) == payloads[3]);
}

INSTANTIATE_TEST_SUITE_P(DataPlanes, DeviceTransportTest, ::testing::Values("nccl", "ipc"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// TCP between device regions: rows staged through host memory by the copy
// kernel on both sides (the TCP path of a CUDA runner).
class TcpDeviceRegionsTest : public cuda::testing::GpuTest {};

TEST_F(TcpDeviceRegionsTest, ChunksAcrossBlockLayoutsAreByteExact) {
  const TransferSpec spec = Shape(37);
  Side src(spec, 256, 4, 1, 0);
  Side dst(spec, 256, 7, 2, 0);
  auto staging = CudaKvStaging::Create();
  ASSERT_TRUE(staging.ok()) << staging.status();
  TcpReceiverOptions receiver_options;
  receiver_options.device_staging = *staging;
  auto receiver =
      TcpKvReceiver::Create("127.0.0.1", 0, dst.kv().regions(), std::move(receiver_options));
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  TcpSenderOptions sender_options;
  sender_options.device_staging = *staging;
  auto sender = TcpKvSender::Create(src.kv().regions(), std::move(sender_options));
  ASSERT_TRUE(sender.ok()) << sender.status();

  const auto payloads = RandomLayers(spec, 31);
  const std::vector<int32_t>& from = src.Table(3, spec.num_tokens);
  for (int i = 0; i < spec.num_layers; ++i) src.kv().WriteLayer(i, from, payloads[i]);
  auto sink = std::make_shared<RecordingSink>();
  const std::vector<int32_t> into = dst.Table(3, spec.num_tokens);
  sink->Watch(
      [&dst, into, n = spec.num_tokens](int layer) { return dst.kv().ReadLayer(layer, into, n); },
      spec.num_tokens);
  ASSERT_TRUE((*receiver)->Expect(3, spec, into, sink, kWait).ok());
  auto session = (*sender)->Open((*receiver)->endpoint(), 3, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  for (const auto& [begin, count] : {std::pair{0, 9}, std::pair{9, 28}}) {
    for (int i = 0; i < spec.num_layers; ++i) {
      ASSERT_TRUE(
          (*session)
              ->SendLayer(
                  {.layer = i, .token_begin = begin, .num_tokens = count, .block_table = from})
              .ok());
    }
  }
  DoneWaiter done;
  (*session)->Finish(8, done.Callback());
  auto sent = done.Wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  for (int i = 0; i < spec.num_layers; ++i) {
    EXPECT_TRUE(sink->layers().at(i) == payloads[i]) << "layer " << i;
  }
  src.Release(3);
  dst.Release(3);
}

TEST_F(TcpDeviceRegionsTest, TheNcclTransportRefusesHostRegions) {
  kvtransfer::testing::HostKv host(Shape(), 8, 4);
  auto sender = DeviceKvSender::Create(host.regions());
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(sender.status()), HasSubstr("--kv_transport=tcp"));
  auto receiver = DeviceKvReceiver::Create("127.0.0.1", 0, host.regions());
  EXPECT_EQ(receiver.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Scripted peers (NCCL data plane) ----

// A receiver that answers Hello with NCCL, brings up rank 1 of the
// communicator and accepts every handshake, then misbehaves after the first
// announced chunk: kNeverReceive posts no receive; kAbortComm aborts its
// communicator (keeping the control stream open).
class ScriptedReceiver final : public internal::v1::KvControl::Service {
 public:
  enum class Fault { kNeverReceive, kAbortComm };
  ScriptedReceiver(Fault fault, int device) : fault_(fault), device_(device) {
    auto server = StartGrpcServer("127.0.0.1", 0, {this});
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) {
      server_ = std::move(server->server);
      endpoint_ = absl::StrCat("nccl://127.0.0.1:", server->port);
    }
  }
  ~ScriptedReceiver() override {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }
  const std::string& endpoint() const { return endpoint_; }
  int pairs() const { return pairs_.load(); }

  grpc::Status Pair(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<KvPairResponse, KvPairRequest>* stream) override {
    ++pairs_;
    cudaSetDevice(device_);
    KvPairRequest m;
    if (!stream->Read(&m) || !m.has_hello()) return grpc::Status::CANCELLED;
    KvPairResponse welcome;
    welcome.mutable_welcome()->set_data_plane("nccl");
    stream->Write(welcome);
    if (!stream->Read(&m) || !m.has_comm_init()) return grpc::Status::CANCELLED;
    ncclUniqueId id;
    m.comm_init().nccl_unique_id().copy(id.internal, sizeof id.internal);
    absl::StatusOr<ncclComm_t> comm = InitComm(id, 1, absl::Now() + kWait);
    KvPairResponse ready;
    ready.mutable_comm_ready()->set_ok(comm.ok());
    stream->Write(ready);
    if (!comm.ok()) return grpc::Status::CANCELLED;
    bool aborted = false;
    while (stream->Read(&m)) {
      if (m.has_begin()) {
        KvPairResponse ack;
        ack.mutable_ack()->set_transfer_id(m.begin().transfer_id());
        ack.mutable_ack()->set_ok(true);
        stream->Write(ack);
      } else if (m.has_chunk() && fault_ == Fault::kAbortComm && !aborted) {
        ncclCommAbort(*comm);
        aborted = true;
      }
    }
    if (!aborted) ncclCommAbort(*comm);
    return grpc::Status::OK;
  }

 private:
  const Fault fault_;
  const int device_;
  std::unique_ptr<grpc::Server> server_;
  std::string endpoint_;
  std::atomic<int> pairs_{0};
};

class DeviceTransportFaultTest : public cuda::testing::GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    if (!Emulated() && count < 2) GTEST_SKIP() << "NCCL needs two GPUs";
    peer_device_ = Emulated() ? 0 : 1;
    src_ = std::make_unique<Side>(Shape(), 256, 4, 1, 0);
    DeviceTransportOptions options = FastOptions(false, 0);
    options.stall_timeout = absl::Milliseconds(300);
    auto sender = DeviceKvSender::Create(src_->kv().regions(), options);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = std::move(*sender);
  }
  void TearDown() override {
    if (!IsSkipped() && src_ != nullptr) {  // else SetUp failed before building it
      sender_.reset();
      EXPECT_EQ(src_->blocks_in_use(), 0);
    }
    GpuTest::TearDown();
  }
  // One transfer of every layer to `endpoint`; its `done` status.
  absl::Status SendOne(const std::string& endpoint, TransferId id) {
    const TransferSpec spec = Shape();
    auto session = sender_->Open(endpoint, id, spec);
    if (!session.ok()) return session.status();
    const std::vector<int32_t>& table = src_->Table(id, spec.num_tokens);
    const auto payloads = RandomLayers(spec, static_cast<uint32_t>(id));
    for (int i = 0; i < spec.num_layers; ++i) src_->kv().WriteLayer(i, table, payloads[i]);
    for (int i = 0; i < spec.num_layers; ++i) {
      (*session)
          ->SendLayer(
              {.layer = i, .token_begin = 0, .num_tokens = spec.num_tokens, .block_table = table})
          .IgnoreError();
    }
    DoneWaiter done;
    auto notify = done.Callback();
    (*session)->Finish(1, [this, id, notify](absl::Status s) {
      src_->Release(id);
      notify(s);
    });
    auto result = done.Wait(absl::Seconds(10));
    return result.has_value() ? *result : absl::UnknownError("test: done never came");
  }

  int peer_device_ = 0;
  std::unique_ptr<Side> src_;
  std::unique_ptr<DeviceKvSender> sender_;
};

TEST_F(DeviceTransportFaultTest, PeerThatNeverPostsItsReceiveTimesOutAndThePairReconnects) {
  ScriptedReceiver peer(ScriptedReceiver::Fault::kNeverReceive, peer_device_);
  const absl::Status first = SendOne(peer.endpoint(), 1);
  EXPECT_EQ(first.code(), absl::StatusCode::kDeadlineExceeded) << first;
  EXPECT_THAT(Msg(first), HasSubstr("no progress"));
  EXPECT_THAT(Msg(first), HasSubstr("communicator aborted"));
  EXPECT_EQ(src_->blocks_in_use(), 0);  // the source blocks came back
  // The next transfer builds a new pair (and fails the same way).
  const absl::Status second = SendOne(peer.endpoint(), 2);
  EXPECT_EQ(second.code(), absl::StatusCode::kDeadlineExceeded) << second;
  EXPECT_EQ(peer.pairs(), 2);
}

TEST_F(DeviceTransportFaultTest, CommunicatorErrorFailsOnlyThatPair) {
  ScriptedReceiver broken(ScriptedReceiver::Fault::kAbortComm, peer_device_);
  Side dst(Shape(), 256, 3, 2, peer_device_);
  auto healthy = DeviceKvReceiver::Create("127.0.0.1", 0, dst.kv().regions(),
                                          FastOptions(false, peer_device_));
  ASSERT_TRUE(healthy.ok());
  const TransferSpec spec = Shape();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE((*healthy)->Expect(5, spec, dst.Table(5, spec.num_tokens), sink, kWait).ok());

  const absl::Status failed = SendOne(broken.endpoint(), 4);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(Msg(failed), HasSubstr("NCCL communicator error"));
  // The pair with the healthy receiver is not touched.
  EXPECT_TRUE(SendOne((*healthy)->endpoint(), 5).ok());
  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value() && result->ok());
  dst.Release(5);
}

// A sender that announces a chunk and never sends it: the receiver's
// watchdog fails the pair, its transfer ends, its blocks are free.
TEST_F(DeviceTransportFaultTest, SenderThatNeverSendsWhatItAnnouncedTimesOutAtTheReceiver) {
  Side dst(Shape(), 256, 3, 2, peer_device_);
  DeviceTransportOptions options = FastOptions(false, peer_device_);
  options.stall_timeout = absl::Milliseconds(300);
  auto receiver = DeviceKvReceiver::Create("127.0.0.1", 0, dst.kv().regions(), options);
  ASSERT_TRUE(receiver.ok());
  const TransferSpec spec = Shape();
  auto sink = std::make_shared<RecordingSink>();
  std::vector<int32_t> table = dst.Table(9, spec.num_tokens);
  ASSERT_TRUE((*receiver)->Expect(9, spec, table, sink, absl::Seconds(30)).ok());

  auto stub =
      internal::v1::KvControl::NewStub(MakeChannel(std::string((*receiver)->endpoint()).substr(7)));
  grpc::ClientContext context;
  auto stream = stub->Pair(&context);
  KvPairRequest hello;
  hello.mutable_hello()->set_sender("scripted");
  hello.mutable_hello()->set_max_chunk_bytes(4096);
  ASSERT_TRUE(stream->Write(hello));
  KvPairResponse m;
  ASSERT_TRUE(stream->Read(&m) && m.has_welcome());
  EXPECT_EQ(m.welcome().data_plane(), "nccl");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  KvPairRequest init;
  init.mutable_comm_init()->set_nccl_unique_id(std::string(id.internal, sizeof id.internal));
  ASSERT_TRUE(stream->Write(init));
  absl::StatusOr<ncclComm_t> comm = InitComm(id, 0, absl::Now() + kWait);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE(stream->Read(&m) && m.has_comm_ready() && m.comm_ready().ok());
  KvPairRequest begin;
  *begin.mutable_begin() = MakeHeader(9, spec);
  ASSERT_TRUE(stream->Write(begin));
  KvPairRequest chunk;
  chunk.mutable_chunk()->set_transfer_id(9);
  chunk.mutable_chunk()->set_num_tokens(spec.num_tokens);
  chunk.mutable_chunk()->set_bytes(2 * spec.TokenBytes() * spec.num_tokens);
  ASSERT_TRUE(stream->Write(chunk));  // ... and no ncclSend

  auto result = sink->WaitResult();
  ASSERT_TRUE(result.has_value()) << "the receiver never gave up";
  EXPECT_EQ(result->status().code(), absl::StatusCode::kDeadlineExceeded) << result->status();
  EXPECT_THAT(Msg(result->status()), HasSubstr("no progress"));
  // The receiver ends the pair's stream.
  while (stream->Read(&m)) {
  }
  EXPECT_FALSE(stream->Finish().ok());
  ncclCommAbort(*comm);
  EXPECT_TRUE(pdserve::testing::PollUntil([&] { return (*receiver)->live_pairs() == 0; }));
  dst.Release(9);
  EXPECT_EQ(dst.blocks_in_use(), 0);
}

}  // namespace
}  // namespace pdserve::kvtransfer::device
