// The prefill side of the device transport (kind "nccl").
//
// One pair per decode worker endpoint, created on the first Open() to it:
// a gRPC control stream (KvControl.Pair) to the receiver's KV port, a CUDA
// stream of its own with a queue of its operations (device_common.h), and a
// data plane chosen with the receiver:
//   nccl  a non-blocking two-rank communicator (this side rank 0), its
//         ncclUniqueId sent on the control stream. Each chunk's rows are
//         gathered by the copy kernel into a staging buffer and sent as one
//         ncclSend, after the layer's compute event (cudaStreamWaitEvent),
//         so the host never waits and the send overlaps the later layers.
//         Every transfer of the pair shares the stream, and each chunk is
//         announced on the control stream in the order it was enqueued: the
//         receiver posts its receives in that order, as NCCL's matching
//         wants.
//   ipc   same GPU: the receiver copies straight from this side's blocks
//         (regions exported with CUDA IPC in Hello); a chunk is announced
//         once the layer's event completed.
//
// A watchdog thread fails a pair whose communicator reports an error or
// whose oldest operation stalls past stall_timeout: the communicator is
// aborted (pending operations complete without data), the control stream
// cancelled, only that pair's transfers fail, each once its operations
// drained, and the next Open() to that endpoint builds a new pair. Nothing
// waits forever.
//
// Lifetimes: a session's `done` runs, and Abort returns, once this side's
// operations on the source blocks finished and (ipc) the receiver reported
// that it reads them no more, or the pair failed. Destroying the sender
// fails every pair and joins every thread.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime/model_runner.h"
#include "kvtransfer/device/device_common.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer::device {

class SenderPair;

class DeviceKvSender final : public KvSender {
  struct Private {};

 public:
  // Sends from `regions` (device memory, one per layer; they must outlive
  // the sender). INVALID_ARGUMENT for host regions or bad options.
  static absl::StatusOr<std::unique_ptr<DeviceKvSender>> Create(
      std::span<const engine::KvRegion> regions, DeviceTransportOptions options = {});
  DeviceKvSender(Private, std::span<const engine::KvRegion> regions, DeviceTransportOptions options,
                 internal::v1::KvDevice device);
  ~DeviceKvSender() override;

  // `endpoint` is "nccl://host:port". Connects the pair on first use
  // (bounded by connect_timeout; UNAVAILABLE or DEADLINE_EXCEEDED naming the
  // endpoint when it cannot), then sends the handshake. Thread-safe.
  absl::StatusOr<std::unique_ptr<SendSession>> Open(const std::string& endpoint, TransferId id,
                                                    const TransferSpec& spec) override;

  // "nccl" or "ipc" for a connected pair to `endpoint`, "" if there is none.
  std::string DataPlaneTo(const std::string& endpoint);

 private:
  void Watchdog();
  // The live pair to `endpoint`, connecting a new one if needed.
  absl::StatusOr<std::shared_ptr<SenderPair>> PairTo(const std::string& endpoint);

  const std::span<const engine::KvRegion> regions_;
  const DeviceTransportOptions options_;
  const internal::v1::KvDevice device_;
  DeviceBufferPool staging_;  // outlives every pair (they are joined first)

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Live pairs by endpoint; failed ones wait in retired_ for their threads.
  std::map<std::string, std::shared_ptr<SenderPair>> pairs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<SenderPair>> retired_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;  // last
};

}  // namespace pdserve::kvtransfer::device
