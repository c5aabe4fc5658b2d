// The device transport when the other side's process is killed (SIGKILL)
// in the middle of a transfer: the peer (kv_peer_main.cc) runs in a process
// of its own, so its sockets, communicator and stream die with it. The side
// that lives must end the transfer with a clear status within bounded time
// and free every block. Under the emulation each process has a GPU of its
// own, so the pair runs NCCL (over loopback); on GPUs it needs two devices.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "device_test_util.h"
#include "gmock/gmock.h"
#include "kvtransfer/device/device_receiver.h"
#include "kvtransfer/device/device_sender.h"
#include "tests/integration/subprocess.h"
#include "tests/unit/cuda/gpu_test_util.h"
#include "tests/util/poll.h"

namespace pdserve::kvtransfer::device {
namespace {

using kvtransfer::testing::DeviceKv;
using kvtransfer::testing::DoneWaiter;
using kvtransfer::testing::PeerShape;
using kvtransfer::testing::RecordingSink;

class PeerKillTest : public cuda::testing::GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
#if !defined(PDSERVE_GPU_EMULATION)
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    if (count < 2) GTEST_SKIP() << "NCCL needs two GPUs";
    peer_device_ = 1;
#endif
    options_.stall_timeout = absl::Seconds(2);
    options_.watchdog_interval = absl::Milliseconds(10);
    options_.allow_ipc = false;
  }
  std::string Path(const std::string& name) const {
    return ::testing::TempDir() + "/" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "." + name;
  }
  // Starts the peer with `args`; waits for its ready file.
  absl::StatusOr<std::map<std::string, std::string>> StartPeer(pdserve::testing::Subprocess& peer,
                                                               std::vector<std::string> args) {
    std::remove(Path("ready").c_str());  // a file from an earlier run is not this peer's
    args.insert(args.begin(), PDSERVE_KV_PEER_BIN);
    args.push_back("--ready_file=" + Path("ready"));
    args.push_back("--device=" + std::to_string(peer_device_));
    if (absl::Status s = peer.Start(args, Path("log")); !s.ok()) return s;
    return peer.WaitReady(Path("ready"), absl::Seconds(30));
  }

  int peer_device_ = 0;
  DeviceTransportOptions options_;
};

TEST_F(PeerKillTest, ReceiverProcessKilledMidTransferFailsTheSenderAndFreesItsBlocks) {
  pdserve::testing::Subprocess peer;
  auto ready = StartPeer(peer, {"--role=receiver"});
  ASSERT_TRUE(ready.ok()) << ready.status();
  const TransferSpec spec = PeerShape();
  DeviceKv kv(spec, 64, 5, 1);
  auto sender = DeviceKvSender::Create(kv.regions(), options_);
  ASSERT_TRUE(sender.ok()) << sender.status();
  auto session = (*sender)->Open(ready->at("endpoint"), 1, spec);
  ASSERT_TRUE(session.ok()) << session.status();
  const std::vector<int32_t> table = kv.Allocate(spec.num_tokens);
  auto chunk = [&](int layer) {
    return (*session)->SendLayer(
        {.layer = layer, .token_begin = 0, .num_tokens = spec.num_tokens, .block_table = table});
  };
  ASSERT_TRUE(chunk(0).ok());
  absl::SleepFor(absl::Milliseconds(100));
  peer.Kill();
  for (int layer = 1; layer < spec.num_layers; ++layer) chunk(layer).IgnoreError();
  DoneWaiter done;
  auto notify = done.Callback();
  (*session)->Finish(1, [&kv, &table, notify](absl::Status s) {
    kv.Free(table);  // the transport reads the blocks no more
    notify(s);
  });
  auto sent = done.Wait(absl::Seconds(10));
  ASSERT_TRUE(sent.has_value()) << "the sender hung after its peer died";
  // The cut connection ends it (a stall timeout would say DEADLINE_EXCEEDED).
  EXPECT_EQ(sent->code(), absl::StatusCode::kUnavailable) << *sent;
  EXPECT_EQ(kv.blocks_in_use(), 0);
}

TEST_F(PeerKillTest, SenderProcessKilledMidTransferFailsTheReceiverAndFreesItsBlocks) {
  const TransferSpec spec = PeerShape();
  DeviceKv kv(spec, 64, 3, 2);
  auto receiver = DeviceKvReceiver::Create("127.0.0.1", 0, kv.regions(), options_);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  const std::vector<int32_t> table = kv.Allocate(spec.num_tokens);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE((*receiver)->Expect(1, spec, table, sink, absl::Seconds(60)).ok());
  pdserve::testing::Subprocess peer;
  auto ready = StartPeer(peer, {"--role=sender", "--endpoint=" + (*receiver)->endpoint()});
  ASSERT_TRUE(ready.ok()) << ready.status();
  ASSERT_TRUE(sink->WaitLayers(1, absl::Seconds(10))) << "layer 0 never landed";
  peer.Kill();
  auto result = sink->WaitResult(absl::Seconds(10));
  ASSERT_TRUE(result.has_value()) << "the receiver hung after its peer died";
  // The cut connection ends it (a stall timeout would say DEADLINE_EXCEEDED).
  EXPECT_EQ(result->status().code(), absl::StatusCode::kUnavailable) << result->status();
  kv.Free(table);  // OnComplete came: nothing writes the blocks any more
  EXPECT_TRUE(pdserve::testing::PollUntil([&] { return (*receiver)->live_pairs() == 0; }));
  EXPECT_EQ(kv.blocks_in_use(), 0);
}

}  // namespace
}  // namespace pdserve::kvtransfer::device
