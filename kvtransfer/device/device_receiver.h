// The decode side of the device transport (kind "nccl"): a gRPC server on
// the KV port serving KvControl.Pair, one stream per prefill worker.
//
// Per pair (one stream handler): Hello decides the data plane (CUDA IPC
// when the sender is on this GPU and exported its regions, else NCCL with
// this side as rank 1), then each message runs in order: Begin claims an
// Expect()ed transfer and checks its spec (a mismatch is refused naming the
// field); Chunk posts the NCCL receive of the announced bytes into the
// pair's staging buffer and scatters them into the transfer's blocks with
// the copy kernel (IPC: copies from the sender's blocks straight into this
// side's); Finish brings the first token; Abort the sender's reason. The
// operations run on the pair's stream, in announcement order; a chunk of a
// transfer that is unknown, refused or already failed is still received (and
// dropped) so both sides keep the same order.
//
// A transfer completes (the sink's OnComplete, then the final Ack to the
// sender) once none of its operations is pending and it has every token of
// every layer and the first token, or once it failed: by a sender abort,
// Cancel(), its deadline, a sink error, or the failure of its pair. A
// watchdog fails a pair whose communicator errs or whose oldest operation
// stalls past stall_timeout (the communicator is aborted, so its operations
// drain). Nothing writes a transfer's blocks after OnComplete.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "engine/runtime/model_runner.h"
#include "kvtransfer/device/device_common.h"
#include "kvtransfer/transport.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve::kvtransfer::device {

struct ReceiverPair;
struct RecvTransfer;

class DeviceKvReceiver final : public KvReceiver, private internal::v1::KvControl::Service {
  struct Private {};

 public:
  // Serves on `bind_host`:`port` (0: any free port), writing into `regions`
  // (device memory, one per layer; they must outlive the receiver); the
  // endpoint names `advertise_host` (empty: the bind host).
  static absl::StatusOr<std::unique_ptr<DeviceKvReceiver>> Create(
      const std::string& bind_host, int port, std::span<const engine::KvRegion> regions,
      DeviceTransportOptions options = {}, const std::string& advertise_host = "");
  DeviceKvReceiver(Private, std::span<const engine::KvRegion> regions,
                   DeviceTransportOptions options, internal::v1::KvDevice device);
  // Fails every pair (CANCELLED "kv receiver shutting down") and every
  // pending transfer, waits for their operations, stops the server.
  ~DeviceKvReceiver() override;

  std::string endpoint() const override { return endpoint_; }
  absl::Status Expect(TransferId id, const TransferSpec& spec, std::vector<int32_t> block_table,
                      std::shared_ptr<ReceiveSink> sink, absl::Duration timeout) override;
  // Waits (bounded by the watchdog) for the transfer's pending operations.
  void Cancel(TransferId id) override;

  // Pairs whose stream is open.
  int live_pairs();

 private:
  grpc::Status Pair(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<internal::v1::KvPairResponse,
                                             internal::v1::KvPairRequest>* stream) override;
  // The part of Pair after Hello: sets up the data plane, then runs the
  // pair's messages until the stream ends or the pair fails.
  grpc::Status RunPair(
      const std::shared_ptr<ReceiverPair>& pair, const internal::v1::KvPairRequest::Hello& hello,
      grpc::ServerReaderWriter<internal::v1::KvPairResponse, internal::v1::KvPairRequest>* stream);
  void OnBegin(const std::shared_ptr<ReceiverPair>& pair,
               const internal::v1::KvTransferHeader& header);
  // False when the pair can no longer keep its order (it has failed).
  bool OnChunk(const std::shared_ptr<ReceiverPair>& pair,
               const internal::v1::KvPairRequest::Chunk& chunk);
  void OnOpDone(const std::shared_ptr<RecvTransfer>& t, int layer, int begin, int count,
                const absl::Status& status);
  // Fails the pair (first reason wins): aborts its communicator, cancels its
  // stream, fails its transfers.
  void FailPair(const std::shared_ptr<ReceiverPair>& pair, const absl::Status& why);
  // Sets `t`'s failure unless it has one (and tells its sender to stop).
  void FailLocked(RecvTransfer& t, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes `t` if it is done (outside mu_: the sink, then the sender's Ack).
  void MaybeComplete(const std::shared_ptr<RecvTransfer>& t);
  void SendAckLocked(ReceiverPair& pair, TransferId id, bool done, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watchdog();

  const std::span<const engine::KvRegion> regions_;
  const DeviceTransportOptions options_;
  const internal::v1::KvDevice device_;
  DeviceBufferPool staging_;              // outlives the server and its pairs
  std::string endpoint_;                  // set by Create, then const
  std::unique_ptr<grpc::Server> server_;  // set by Create

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<TransferId, std::shared_ptr<RecvTransfer>> transfers_ ABSL_GUARDED_BY(mu_);
  std::set<std::shared_ptr<ReceiverPair>> pairs_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;  // last
};

}  // namespace pdserve::kvtransfer::device
