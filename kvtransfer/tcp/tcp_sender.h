// TCP KvSender: one connection per transfer, wire format in wire.h.
//
// Open() connects and sends the HEADER on the caller's thread (bounded by
// connect_timeout); everything after runs on the session's writer thread:
// it reads the handshake ACK, writes queued LAYER frames in the order
// SendLayer() queued them, writes FINISH, reads the final ACK and calls
// Finish's `done`. Between frames (and while idle) it watches the socket, so a
// receiver's early ACK{ok=false} fails the session before more is sent.
//
// Lifetimes: writer threads belong to the TcpKvSender, not the session, so a
// session may be destroyed right after Finish() (or from inside `done`) while
// its final ACK is still in flight. Destroying a session without Finish()
// aborts the transfer ("sender dropped the transfer") and waits for its writer
// to stop. Destroying the TcpKvSender fails every transfer still in flight
// (UNAVAILABLE "kv sender shutting down") and joins every writer; sessions
// should not outlive it (if one does, its calls fail and Finish calls `done`
// inline).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  // also how long a dropped session waits before cutting the connection.
  absl::Duration abort_grace = absl::Seconds(1);
};

namespace tcp {
class WriterRegistry;  // tcp_sender.cc: owns and joins the writer threads
}  // namespace tcp

class TcpKvSender final : public KvSender {
 public:
  static std::unique_ptr<KvSender> Create(TcpSenderOptions options = {});
  ~TcpKvSender() override;

  // `endpoint` is "tcp://host:port" or "tcp://[v6]:port". INVALID_ARGUMENT
  // for a bad endpoint or spec; UNAVAILABLE (naming the endpoint) or
  // DEADLINE_EXCEEDED when it cannot connect or send the HEADER. Thread-safe.
  absl::StatusOr<std::unique_ptr<SendSession>> Open(const std::string& endpoint, TransferId id,
                                                    const TransferSpec& spec) override;

 private:
  explicit TcpKvSender(TcpSenderOptions options);

  const TcpSenderOptions options_;
  const std::unique_ptr<tcp::WriterRegistry> writers_;
};

}  // namespace pdserve::kvtransfer
