// TCP KvReceiver: listens on one port; each accepted connection carries
// transfers one after another in the wire format of wire.h (senders pool
// their connections), and each chunk's rows are read from the socket
// straight into the destination blocks (host regions) or through a host
// staging buffer (device regions).
//
// Threads (all owned and joined by the receiver):
//   accept thread   accepts connections and holds each (no thread) until its
//                   first bytes arrive, then starts one handler for it (or
//                   evicts and refuses: see "Connection slots" below);
//   timer thread    fails Expect()ed transfers that no sender claimed before
//                   their deadline (DEADLINE_EXCEEDED);
//   handler threads run the handshake, read frames into the blocks, call the
//                   sink, time out their own transfer at its deadline, send
//                   the ACKs, and wait (idle_timeout) for the connection's
//                   next transfer.
// Sink calls for one transfer never overlap: OnLayer runs on its handler
// thread; OnComplete runs exactly once, on a handler, the timer, the caller of
// Cancel(), or the destructor, and after it nothing writes the transfer's
// blocks. A sink must not call Cancel() for its own transfer from inside
// OnLayer (it would wait on itself); it returns an error instead.
//
// Connection slots (tcp/connection_slots.h): a new connection must present
// the cluster credential in its first HEADER within handshake_timeout (2 s)
// of its accept; until then it is unauthenticated. Two tiers:
//   waiting   connections that have sent nothing yet cost a descriptor in
//             the accept thread's epoll set, no thread: at most
//             max_waiting_connections (and a quarter of RLIMIT_NOFILE), at
//             most max_waiting_per_source from one address; beyond, the
//             oldest waiting connection (of that address, or of all) is
//             closed for the newcomer. A sender writes its HEADER right
//             after connecting, so it leaves this tier at once.
//   handlers  a connection whose bytes arrived gets a thread and reads its
//             HEADER: at most max_connections, and at most
//             max_unauthenticated_per_source still in their handshake from
//             one address; when short, the oldest idle unauthenticated
//             handler is closed for the newcomer. An authenticated
//             connection (a transfer in progress, a sender's pooled
//             connection) is never closed for a newcomer; when every slot
//             is authenticated or mid-handshake, the newcomer is refused
//             (ACK{false} UNAVAILABLE).
// So idle strangers hold no thread and cannot keep the cluster's senders
// out.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/runtime/model_runner.h"
#include "kvtransfer/device_staging.h"
#include "kvtransfer/tcp/connection_slots.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer {
namespace tcp {
class Connection;
class Listener;
class WakeFd;
}  // namespace tcp

struct TcpReceiverOptions {
  // Host put in endpoint(); empty = the bind host. Set it when binding a
  // wildcard address ("0.0.0.0", "::") so senders get a reachable address.
  std::string advertise_host;
  // A new connection must send its HEADER (with the credential) within this.
  // A sender writes it right after connecting, so 2 s is ample on a loaded
  // host and bounds how long a stranger holds a slot.
  absl::Duration handshake_timeout = absl::Seconds(2);
  // After refusing or failing a transfer, how long to keep reading (and
  // discarding) the sender's data so the error ACK is not lost to a TCP RST.
  absl::Duration linger = absl::Seconds(1);
  // Connection slots; see above.
  int max_connections = 256;
  // Unauthenticated handlers from one address; see above.
  int max_unauthenticated_per_source = 32;
  // Connections that have sent nothing yet, in all and from one address.
  int max_waiting_connections = 1024;
  int max_waiting_per_source = 512;
  // How long a connection may wait between transfers before it is closed
  // (above the senders' idle_timeout).
  absl::Duration idle_timeout = absl::Seconds(60);
  // Stages device regions through host memory; null: device regions are
  // refused at Create.
  std::shared_ptr<KvDeviceStaging> device_staging;
};

class TcpKvReceiver final : public KvReceiver {
 public:
  // Listens on `bind_host`:`port` (port 0 = any free port) and writes into
  // `regions` (the runner's, one per layer; they must outlive the receiver).
  static absl::StatusOr<std::unique_ptr<TcpKvReceiver>> Create(
      const std::string& bind_host, int port, std::span<const engine::KvRegion> regions,
      TcpReceiverOptions options = {});
  // Stops accepting, fails every pending transfer with CANCELLED ("kv
  // receiver shutting down"), closes every connection and joins all threads.
  ~TcpKvReceiver() override;

  std::string endpoint() const override { return endpoint_; }
  // INVALID_ARGUMENT for a bad spec (or one the regions cannot hold), a
  // block table that does not cover it, a null sink or a non-positive
  // timeout; ALREADY_EXISTS if `id` is already expected. Thread-safe.
  absl::Status Expect(TransferId id, const TransferSpec& spec, std::vector<int32_t> block_table,
                      std::shared_ptr<ReceiveSink> sink, absl::Duration timeout) override;
  // Thread-safe; a no-op for an unknown or already completed id. Cuts the
  // transfer's connection and waits for a block write or OnLayer call in
  // progress on it to return.
  void Cancel(TransferId id) override;

  // Connections accepted so far (senders pool theirs: a steady stream of
  // transfers from one sender reuses a few).
  int connections_accepted() const {
    absl::MutexLock l(&mu_);
    return connections_accepted_;
  }
  // Unauthenticated connections closed to make room (waiting or in a
  // handler), and connections refused for want of a handler slot, so far.
  int connections_evicted() const {
    absl::MutexLock l(&mu_);
    return connections_evicted_;
  }
  int connections_refused() const {
    absl::MutexLock l(&mu_);
    return connections_refused_;
  }

 private:
  struct Transfer;
  struct Handler;

  TcpKvReceiver(TcpReceiverOptions options, std::span<const engine::KvRegion> regions,
                std::unique_ptr<tcp::Listener> listener, std::unique_ptr<tcp::WakeFd> stop_wake,
                std::string endpoint, int epoll_fd, int max_waiting);

  struct Waiting;

  void AcceptLoop();
  // Accept thread: takes new connections into the waiting tier.
  void AcceptReady();
  // Accept thread: closes the oldest waiting connection; false if none.
  bool EvictOldestWaiting();
  // Accept thread: closes waiting connections past their deadline.
  void ExpireWaiting(absl::Time now);
  void TimerLoop();
  // Gives `conn`, whose first HEADER is due by `deadline`, a handler thread.
  void StartHandler(std::shared_ptr<tcp::Connection> conn, absl::Time deadline);
  void ReapFinishedHandlers();
  // Handler thread body: one connection (slot `slot`), its transfers one
  // after another; the first HEADER is due by `first_deadline`.
  void HandleConnection(const std::shared_ptr<tcp::Connection>& conn, uint64_t slot,
                        absl::Time first_deadline);
  // Handshake: the claimed transfer, or the reason to refuse the connection.
  // The HEADER must arrive by `deadline`; its credential authenticates
  // `slot`.
  absl::StatusOr<std::shared_ptr<Transfer>> Claim(const std::shared_ptr<tcp::Connection>& conn,
                                                  uint64_t slot, absl::Time deadline);
  // Streams chunk frames into the blocks until FINISH (the first token) or a failure.
  absl::StatusOr<int32_t> ReceiveLayers(Transfer& t, tcp::Connection& conn);
  // Reads one chunk's rows (K then V) into the transfer's blocks and tells
  // the sink. Holds the transfer's sink lock while it writes. `io_error`
  // says whether a failure came from the connection.
  absl::Status ReadChunk(Transfer& t, tcp::Connection& conn, int layer, int begin, int count,
                         bool* io_error);
  // Removes `t` from transfers_ and completes it; false if it had completed.
  bool Finalize(const std::shared_ptr<Transfer>& t, absl::StatusOr<int32_t> result);
  // Sends ACK{false} and closes after a bounded drain of the sender's data.
  void RefuseAndClose(tcp::Connection& conn, const absl::Status& why);

  const TcpReceiverOptions options_;
  const std::span<const engine::KvRegion> regions_;
  const std::unique_ptr<tcp::Listener> listener_;
  const std::unique_ptr<tcp::WakeFd> stop_wake_;  // wakes the accept thread
  const std::string endpoint_;
  const int epoll_fd_;     // the accept thread's: listener, wake-up, waiting connections
  const int max_waiting_;  // max_waiting_connections within the descriptor limit

  // The waiting tier: the accept thread's only (and the destructor's, after it).
  tcp::ConnectionSlots waiting_slots_;
  absl::flat_hash_map<uint64_t, Waiting> waiting_;
  uint64_t next_waiting_ = 2;   // waiting ids (epoll data); 0 and 1 are the listener, wake-up
  bool accept_paused_ = false;  // accept() failed with nothing to evict

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int connections_accepted_ ABSL_GUARDED_BY(mu_) = 0;
  int connections_evicted_ ABSL_GUARDED_BY(mu_) = 0;
  int connections_refused_ ABSL_GUARDED_BY(mu_) = 0;
  tcp::ConnectionSlots slots_ ABSL_GUARDED_BY(mu_);
  uint64_t next_slot_ ABSL_GUARDED_BY(mu_) = 1;  // slot ids; 0 is none
  absl::CondVar timer_cv_;                       // signalled on Expect and on stop
  absl::flat_hash_map<TransferId, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  std::list<Handler> handlers_ ABSL_GUARDED_BY(mu_);
  // The handlers whose connections hold a slot, by slot id.
  absl::flat_hash_map<uint64_t, Handler*> slot_handlers_ ABSL_GUARDED_BY(mu_);

  // Started last in Create, joined first in the destructor.
  std::thread accept_thread_;
  std::thread timer_thread_;
};

}  // namespace pdserve::kvtransfer
