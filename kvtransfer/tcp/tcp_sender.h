// TCP KvSender: pooled connections per receiver, wire format in wire.h.
//
// Each connection is a link with a thread of its own. A transfer takes an
// idle link to its endpoint (or connects a new one), sends the HEADER on the
// caller's thread in Open() (bounded by connect_timeout and
// handshake_timeout), and the link's thread does the rest: it reads the
// handshake ACK, writes the queued chunks in the order SendLayer() queued
// them (gathering each chunk's rows straight from the source blocks: host
// regions by address, device regions through host staging), writes FINISH,
// reads the final ACK and calls Finish's `done`. Between frames (and while
// idle) it watches the socket, so a receiver's early ACK{ok=false} fails the
// session before more is sent. After a transfer that ended with ACK{ok} the
// link goes back to its endpoint's idle list (at most
// max_idle_connections_per_peer, each closed after idle_timeout); after any
// failure it closes.
//
// Lifetimes: links belong to the TcpKvSender, not the session, so a session
// may be destroyed right after Finish() (or from inside `done`) while its
// final ACK is still in flight. Destroying a session without Finish() aborts
// the transfer ("sender dropped the transfer") and waits for its link to let
// go of it. Destroying the TcpKvSender fails every transfer still in flight
// (UNAVAILABLE "kv sender shutting down") and joins every link; sessions
// should not outlive it (if one does, its calls fail and Finish calls `done`
// inline).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/runtime/model_runner.h"
#include "kvtransfer/device_staging.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer {

struct TcpSenderOptions {
  // TCP connect, on the caller's thread in Open().
  absl::Duration connect_timeout = absl::Seconds(5);
  // HEADER write (in Open) and the receiver's handshake ACK.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // Longest one frame write may stall (the receiver not reading).
  absl::Duration io_timeout = absl::Seconds(30);
  // FINISH -> final ACK.
  absl::Duration final_ack_timeout = absl::Seconds(30);
  // After Abort: budget for sending ABORT and reading the receiver's reply;
  // also how long Abort and a dropped session wait for a chunk being written
  // before cutting the connection.
  absl::Duration abort_grace = absl::Seconds(1);
  // Idle connections kept per receiver endpoint, and how long each is kept
  // (below the receiver's idle_timeout, so the receiver never closes a
  // connection this side still offers).
  int max_idle_connections_per_peer = 8;
  absl::Duration idle_timeout = absl::Seconds(20);
  // Stages device regions through host memory; null: device regions are
  // refused at Create.
  std::shared_ptr<KvDeviceStaging> device_staging;
};

namespace tcp {
class LinkPool;  // tcp_sender.cc: owns the links and joins their threads
}  // namespace tcp

class TcpKvSender final : public KvSender {
  struct Private {};

 public:
  // Sends from `regions` (the runner's, one per layer; they must outlive the
  // sender). INVALID_ARGUMENT for device regions without device_staging or
  // bad options.
  static absl::StatusOr<std::unique_ptr<KvSender>> Create(std::span<const engine::KvRegion> regions,
                                                          TcpSenderOptions options = {});
  TcpKvSender(Private, std::span<const engine::KvRegion> regions, TcpSenderOptions options);
  ~TcpKvSender() override;

  // `endpoint` is "tcp://host:port" or "tcp://[v6]:port". INVALID_ARGUMENT
  // for a bad endpoint or spec (or one the regions cannot hold);
  // UNAVAILABLE (naming the endpoint) or DEADLINE_EXCEEDED when it cannot
  // connect or send the HEADER. Thread-safe.
  absl::StatusOr<std::unique_ptr<SendSession>> Open(const std::string& endpoint, TransferId id,
                                                    const TransferSpec& spec) override;

 private:
  const std::span<const engine::KvRegion> regions_;
  const TcpSenderOptions options_;
  const std::shared_ptr<tcp::LinkPool> links_;
};

}  // namespace pdserve::kvtransfer
