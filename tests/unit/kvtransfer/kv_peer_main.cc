// One end of a device-transport transfer in a process of its own, for the
// tests that kill a side mid-transfer (device_peer_kill_test.cc). It writes
// a ready file (JSON) once it is where the test wants it, then waits to be
// killed.
//   kv_peer --role=receiver --ready_file=F [--device=0]
//       Expects transfer 1 (PeerShape) into fresh blocks; ready file
//       {"endpoint": E}.
//   kv_peer --role=sender --endpoint=E --ready_file=F [--device=0]
//       Opens transfer 1 to E and sends layer 0; ready file {"sent": "1"}.
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "common/base/process.h"
#include "common/ready_file.h"
#include "device_test_util.h"
#include "kvtransfer/device/device_receiver.h"
#include "kvtransfer/device/device_sender.h"

ABSL_FLAG(std::string, role, "", "receiver or sender");
ABSL_FLAG(std::string, endpoint, "", "sender: the receiver's endpoint");
ABSL_FLAG(std::string, ready_file, "", "Where to announce readiness");
ABSL_FLAG(int, device, 0, "CUDA device");

namespace pdserve::kvtransfer {
namespace {

class IgnoringSink final : public ReceiveSink {
 public:
  void OnComplete(absl::StatusOr<int32_t> first_token) override {
    std::fprintf(stderr, "transfer ended: %s\n", first_token.status().ToString().c_str());
  }
};

int Main() {
  const int device = absl::GetFlag(FLAGS_device);
  const TransferSpec spec = testing::PeerShape();
  testing::DeviceKv kv(spec, 64, 4, 3, device);
  device::DeviceTransportOptions options;
  options.device = device;
  options.allow_ipc = false;
  const std::vector<int32_t> table = kv.Allocate(spec.num_tokens);
  std::unique_ptr<KvReceiver> receiver;
  std::unique_ptr<KvSender> sender;
  std::unique_ptr<SendSession> session;
  if (absl::GetFlag(FLAGS_role) == "receiver") {
    auto r = device::DeviceKvReceiver::Create("127.0.0.1", 0, kv.regions(), options);
    if (!r.ok()) return 1;
    receiver = std::move(*r);
    if (!receiver->Expect(1, spec, table, std::make_shared<IgnoringSink>(), absl::Seconds(600))
             .ok()) {
      return 1;
    }
    if (!WriteReadyFile(absl::GetFlag(FLAGS_ready_file), {{"endpoint", receiver->endpoint()}})
             .ok()) {
      return 1;
    }
  } else {
    auto s = device::DeviceKvSender::Create(kv.regions(), options);
    if (!s.ok()) return 1;
    sender = std::move(*s);
    auto opened = sender->Open(absl::GetFlag(FLAGS_endpoint), 1, spec);
    if (!opened.ok()) return 1;
    session = std::move(*opened);
    if (!session
             ->SendLayer({.layer = 0,
                          .token_begin = 0,
                          .num_tokens = spec.num_tokens,
                          .block_table = table})
             .ok() ||
        !WriteReadyFile(absl::GetFlag(FLAGS_ready_file), {{"sent", "1"}}).ok()) {
      return 1;
    }
  }
  while (true) absl::SleepFor(absl::Seconds(1));  // until killed
}

}  // namespace
}  // namespace pdserve::kvtransfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::kvtransfer::Main();
}
