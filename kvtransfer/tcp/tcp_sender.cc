// TCP KvSender (lifetimes in tcp_sender.h, wire format in wire.h).
//
// Per session, the writer thread runs:
//   wait for the handshake ACK (refusal -> FAILED_PRECONDITION with the
//   receiver's text) -> LAYER frames as queued -> FINISH -> final ACK ->
//   done(status).
// Abort() replaces whatever is left with one ABORT frame, then a lingering
// close so the receiver reads the message before the connection goes.
// Status codes: refusal FAILED_PRECONDITION; receiver failure reported by ACK
// ABORTED; lost connection UNAVAILABLE; stalls DEADLINE_EXCEEDED.
#include "kvtransfer/tcp/tcp_sender.h"

#include <poll.h>

#include <deque>
#include <list>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"

namespace pdserve::kvtransfer {
namespace tcp {
namespace {

// After a failed write, how long to look for the receiver's ACK explaining it.
constexpr absl::Duration kExplainTimeout = absl::Milliseconds(200);

// State of one send session, shared by the caller's TcpSendSession, the
// writer thread and (weakly) the WriterRegistry. Caller-side methods are
// called from one thread at a time; RunWriter runs on the writer thread.
class SessionCore {
 public:
  SessionCore(std::string endpoint, TransferId id, const TransferSpec& spec,
              const TcpSenderOptions& options, std::shared_ptr<Connection> conn,
              std::unique_ptr<WakeFd> wake)
      : endpoint_(std::move(endpoint)),
        id_(id),
        spec_(spec),
        options_(options),
        conn_(std::move(conn)),
        wake_(std::move(wake)),
        queued_(spec.num_layers, false) {}

  // ---- Caller side ----
  absl::Status SendLayer(int layer, std::vector<std::byte> payload);
  void Finish(int32_t first_token, std::function<void(absl::Status)> done);
  void Abort(const absl::Status& why);
  // The TcpSendSession is being destroyed. Without Finish this aborts the
  // transfer and returns once the writer has stopped (abort_grace, then the
  // connection is cut).
  void Release();
  // The sender is being destroyed: fail now, cut the connection; the writer
  // calls a pending `done` and exits.
  void Shutdown();

  // ---- Writer thread ----
  void RunWriter();
  bool writer_finished() {
    absl::MutexLock l(&mu_);
    return writer_finished_;
  }

 private:
  enum class Step { kWait, kLayer, kAbort, kFinish, kExit };
  struct Layer {
    int index = 0;
    std::vector<std::byte> payload;
  };

  Step NextStep(Layer* layer, int32_t* token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitHandshake();
  void WaitForWork();
  void WriteLayer(Layer& layer);
  void SendAbortFrame();
  absl::Status FinishTransfer(int32_t first_token);
  // The receiver sent something mid-stream: its ACK{false} or EOF. Fails the session.
  void HandleReceiverInput();
  // The status for a failed write, preferring the receiver's own explanation.
  absl::Status WriteFailure(const absl::Status& io_error, absl::string_view doing);
  absl::Status ReceiverFailed(absl::string_view error) const {
    return absl::AbortedError(
        absl::StrCat("kv receiver ", endpoint_, " failed transfer ", id_, ": ", error));
  }
  // Records the first failure, drops queued layers, stops using the stream.
  void Fail(const absl::Status& why);
  std::string Where() const { return absl::StrCat("kv transfer ", id_, " to ", endpoint_); }

  const std::string endpoint_;
  const TransferId id_;
  const TransferSpec spec_;
  const TcpSenderOptions options_;
  const std::shared_ptr<Connection> conn_;
  const std::unique_ptr<WakeFd> wake_;  // signalled whenever the fields below change
  // Writer thread only: frames may still be written (no failure seen on the stream).
  bool usable_ = true;

  absl::Mutex mu_;
  std::deque<Layer> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> queued_ ABSL_GUARDED_BY(mu_);  // layers accepted by SendLayer
  absl::Status failure_ ABSL_GUARDED_BY(mu_);      // first error; OK while healthy
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  int32_t first_token_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(absl::Status)> done_ ABSL_GUARDED_BY(mu_);
  bool abort_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool abort_handled_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;         // no more caller calls; exit when idle
  bool in_final_ack_ ABSL_GUARDED_BY(mu_) = false;    // FINISH under way: Abort cuts the stream
  bool writer_exiting_ ABSL_GUARDED_BY(mu_) = false;  // writer will not take more work
  bool writer_finished_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status SessionCore::SendLayer(int layer, std::vector<std::byte> payload) {
  if (layer < 0 || layer >= spec_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": layer ", layer, " out of range [0, ", spec_.num_layers, ")"));
  }
  if (payload.size() != spec_.LayerBytes()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": layer ", layer, " payload is ",
                                                   payload.size(), " bytes, expected ",
                                                   spec_.LayerBytes()));
  }
  {
    absl::MutexLock l(&mu_);
    if (!failure_.ok()) return failure_;
    if (finish_requested_ || abort_requested_ || closing_) {
      return absl::FailedPreconditionError(absl::StrCat(Where(), ": SendLayer after Finish"));
    }
    if (queued_[layer]) {
      return absl::AlreadyExistsError(absl::StrCat(Where(), ": layer ", layer, " already sent"));
    }
    queued_[layer] = true;
    queue_.push_back(Layer{layer, std::move(payload)});
  }
  wake_->Signal();
  return absl::OkStatus();
}

void SessionCore::Finish(int32_t first_token, std::function<void(absl::Status)> done) {
  absl::Status inline_status;
  {
    absl::MutexLock l(&mu_);
    if (finish_requested_) {
      inline_status = absl::FailedPreconditionError(absl::StrCat(Where(), ": Finish called twice"));
    } else if (writer_exiting_) {
      inline_status =
          !failure_.ok()
              ? failure_
              : absl::UnavailableError(absl::StrCat(Where(), ": the session's writer has stopped"));
    } else {
      finish_requested_ = true;
      first_token_ = first_token;
      done_ = std::move(done);
    }
  }
  if (!inline_status.ok()) {
    if (done) done(inline_status);
    return;
  }
  wake_->Signal();
}

void SessionCore::Abort(const absl::Status& why) {
  bool cut = false;
  {
    absl::MutexLock l(&mu_);
    // Too late once done() is decided; during FINISH the abort still wins.
    if (abort_requested_ || (writer_exiting_ && !in_final_ack_)) return;
    abort_requested_ = true;
    if (failure_.ok()) {
      failure_ =
          why.ok() ? absl::CancelledError(absl::StrCat(Where(), ": aborted by the sender")) : why;
    }
    queue_.clear();
    cut = in_final_ack_;  // nothing is left to say; stop waiting for the ACK
  }
  if (cut) conn_->Shutdown();
  wake_->Signal();
}

void SessionCore::Release() {
  bool wait = false;
  {
    absl::MutexLock l(&mu_);
    closing_ = true;
    wait = !finish_requested_ && !writer_exiting_;
    if (wait && !abort_requested_) {
      abort_requested_ = true;
      if (failure_.ok()) {
        failure_ = absl::CancelledError(
            absl::StrCat("kv sender dropped the transfer (", Where(), ", no Finish)"));
      }
      queue_.clear();
    }
  }
  wake_->Signal();
  if (!wait) return;  // after Finish the writer completes on its own
  absl::MutexLock l(&mu_);
  const auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return writer_finished_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&finished),
                            options_.abort_grace + absl::Milliseconds(100))) {
    conn_->Shutdown();  // the writer is stuck on the network: unblock it
    mu_.Await(absl::Condition(&finished));
  }
}

void SessionCore::Shutdown() {
  {
    absl::MutexLock l(&mu_);
    closing_ = true;
    if (!writer_exiting_ || in_final_ack_) {
      abort_requested_ = true;
      if (failure_.ok()) {
        failure_ = absl::UnavailableError(absl::StrCat("kv sender shutting down: ", Where()));
      }
      queue_.clear();
    }
  }
  conn_->Shutdown();
  wake_->Signal();
}

void SessionCore::Fail(const absl::Status& why) {
  {
    absl::MutexLock l(&mu_);
    if (failure_.ok()) failure_ = why;
    queue_.clear();
  }
  usable_ = false;
  conn_->Shutdown();
}

SessionCore::Step SessionCore::NextStep(Layer* layer, int32_t* token) {
  if (!queue_.empty()) {
    *layer = std::move(queue_.front());
    queue_.pop_front();
    return Step::kLayer;
  }
  if (abort_requested_ && !abort_handled_) {
    abort_handled_ = true;
    return Step::kAbort;
  }
  if (finish_requested_) {
    in_final_ack_ = true;
    writer_exiting_ = true;
    *token = first_token_;
    return Step::kFinish;
  }
  if (closing_) {
    writer_exiting_ = true;
    return Step::kExit;
  }
  return Step::kWait;
}

void SessionCore::RunWriter() {
  if (absl::Status s = AwaitHandshake(); !s.ok()) {
    bool aborted = false;
    {
      absl::MutexLock l(&mu_);
      aborted = abort_requested_;
    }
    // An abort during the handshake still sends ABORT (the stream is intact).
    if (!aborted) Fail(s);
  }
  bool running = true;
  while (running) {
    Layer layer;
    int32_t token = 0;
    Step step;
    {
      absl::MutexLock l(&mu_);
      step = NextStep(&layer, &token);
    }
    switch (step) {
      case Step::kWait:
        WaitForWork();
        break;
      case Step::kLayer:
        WriteLayer(layer);
        break;
      case Step::kAbort:
        SendAbortFrame();
        break;
      case Step::kFinish: {
        absl::Status result;
        {
          absl::MutexLock l(&mu_);
          result = failure_;
        }
        if (result.ok()) result = FinishTransfer(token);
        std::function<void(absl::Status)> done;
        {
          absl::MutexLock l(&mu_);
          if (!result.ok() && abort_requested_ && !failure_.ok()) result = failure_;
          if (failure_.ok()) failure_ = result;
          in_final_ack_ = false;
          done = std::move(done_);
        }
        conn_->Shutdown();
        // May destroy the session or even the sender (see WriterRegistry);
        // afterwards this thread touches only *this, which it co-owns.
        if (done) done(result);
        running = false;
        break;
      }
      case Step::kExit:
        running = false;
        break;
    }
  }
  conn_->Shutdown();
  absl::MutexLock l(&mu_);
  writer_finished_ = true;
}

absl::Status SessionCore::AwaitHandshake() {
  const absl::Time deadline = absl::Now() + options_.handshake_timeout;
  while (true) {
    absl::StatusOr<bool> readable = conn_->WaitReadable(deadline, wake_.get());
    if (!readable.ok()) {
      return absl::Status(readable.status().code(),
                          absl::StrCat(Where(), ": no handshake ACK within ",
                                       absl::FormatDuration(options_.handshake_timeout), " (",
                                       readable.status().message(), ")"));
    }
    if (*readable) break;
    wake_->Drain();
    absl::MutexLock l(&mu_);
    if (abort_requested_) return absl::CancelledError("aborted during the handshake");
  }
  absl::StatusOr<internal::v1::KvTransferAck> ack = ReadAckFrame(*conn_, deadline);
  if (!ack.ok()) return WithContext(ack.status(), absl::StrCat(Where(), ": reading handshake ACK"));
  if (!ack->ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv receiver ", endpoint_, " refused transfer ", id_, ": ", ack->error()));
  }
  return absl::OkStatus();
}

void SessionCore::WaitForWork() {
  if (usable_) {
    absl::StatusOr<bool> readable = conn_->WaitReadable(absl::InfiniteFuture(), wake_.get());
    if (readable.ok() && *readable) {
      HandleReceiverInput();
      return;
    }
  } else {
    pollfd p{wake_->fd(), POLLIN, 0};
    ::poll(&p, 1, -1);
  }
  wake_->Drain();
}

void SessionCore::HandleReceiverInput() {
  absl::StatusOr<internal::v1::KvTransferAck> ack =
      ReadAckFrame(*conn_, absl::Now() + options_.abort_grace);
  absl::Status why;
  if (!ack.ok()) {
    why = absl::UnavailableError(
        absl::StrCat(Where(), ": receiver closed the connection (", ack.status().message(), ")"));
  } else if (!ack->ok()) {
    why = ReceiverFailed(ack->error());
  } else {
    why = absl::InternalError(absl::StrCat(Where(), ": receiver acknowledged before FINISH"));
  }
  Fail(why);
}

absl::Status SessionCore::WriteFailure(const absl::Status& io_error, absl::string_view doing) {
  // A receiver that failed the transfer sends ACK{false} before closing.
  const absl::Time deadline = absl::Now() + kExplainTimeout;
  absl::StatusOr<bool> readable = conn_->WaitReadable(deadline, nullptr);
  if (readable.ok() && *readable) {
    absl::StatusOr<internal::v1::KvTransferAck> ack = ReadAckFrame(*conn_, deadline);
    if (ack.ok() && !ack->ok()) return ReceiverFailed(ack->error());
  }
  return WithContext(io_error, absl::StrCat(Where(), ": ", doing));
}

void SessionCore::WriteLayer(Layer& layer) {
  if (!usable_) return;
  if (conn_->ReadableNow()) {
    HandleReceiverInput();
    return;
  }
  absl::Status s =
      WriteLayerFrame(*conn_, layer.index, layer.payload, absl::Now() + options_.io_timeout);
  layer.payload = {};  // the caller's memory goes as soon as it is on the wire
  if (!s.ok()) Fail(WriteFailure(s, absl::StrCat("sending layer ", layer.index)));
}

void SessionCore::SendAbortFrame() {
  absl::Status why;
  {
    absl::MutexLock l(&mu_);
    why = failure_;
  }
  if (usable_) {
    const absl::Time deadline = absl::Now() + options_.abort_grace;
    const std::string message = SanitizeUtf8(why.message(), kMaxControlPayloadBytes);
    const auto bytes = std::as_bytes(std::span<const char>(message.data(), message.size()));
    if (WriteFrame(*conn_, FrameType::kAbort, bytes, deadline).ok()) {
      // Lingering close: let the receiver read ABORT before our FIN/RST.
      conn_->ShutdownWrite();
      conn_->DrainUntilEof(deadline);
    }
    usable_ = false;
  }
  conn_->Shutdown();
}

absl::Status SessionCore::FinishTransfer(int32_t first_token) {
  if (conn_->ReadableNow()) {
    HandleReceiverInput();
    absl::MutexLock l(&mu_);
    return failure_;
  }
  if (absl::Status s = WriteFinishFrame(*conn_, first_token, absl::Now() + options_.io_timeout);
      !s.ok()) {
    return WriteFailure(s, "sending FINISH");
  }
  absl::StatusOr<internal::v1::KvTransferAck> ack =
      ReadAckFrame(*conn_, absl::Now() + options_.final_ack_timeout);
  if (!ack.ok())
    return WithContext(ack.status(), absl::StrCat(Where(), ": waiting for the final ACK"));
  if (!ack->ok()) return ReceiverFailed(ack->error());
  return absl::OkStatus();
}

// The caller's handle; forwards to the shared core.
class TcpSendSession final : public SendSession {
 public:
  explicit TcpSendSession(std::shared_ptr<SessionCore> core) : core_(std::move(core)) {}
  ~TcpSendSession() override { core_->Release(); }

  absl::Status SendLayer(int layer, std::vector<std::byte> payload) override {
    return core_->SendLayer(layer, std::move(payload));
  }
  void Finish(int32_t first_token, std::function<void(absl::Status)> done) override {
    core_->Finish(first_token, std::move(done));
  }
  void Abort(const absl::Status& why) override { core_->Abort(why); }

 private:
  const std::shared_ptr<SessionCore> core_;
};

}  // namespace

// Owns every writer thread of one TcpKvSender. A thread keeps its core alive
// (strong reference) until it returns; the registry holds a weak one so that
// a finished session's sockets close as soon as its owners let go.
class WriterRegistry {
 public:
  WriterRegistry() = default;
  WriterRegistry(const WriterRegistry&) = delete;
  WriterRegistry& operator=(const WriterRegistry&) = delete;

  // Fails every live session and joins every writer. If run on a writer
  // thread (a `done` callback destroying the sender), that one thread is
  // detached instead: it only touches its own core, which it co-owns.
  ~WriterRegistry() {
    std::list<Entry> entries;
    {
      absl::MutexLock l(&mu_);
      entries.swap(entries_);
    }
    for (Entry& e : entries) {
      if (std::shared_ptr<SessionCore> core = e.core.lock()) core->Shutdown();
    }
    for (Entry& e : entries) {
      if (e.thread.get_id() == std::this_thread::get_id()) {
        e.thread.detach();
      } else {
        e.thread.join();
      }
    }
  }

  absl::Status Start(const std::shared_ptr<SessionCore>& core) {
    Reap();
    absl::MutexLock l(&mu_);
    entries_.emplace_back();
    Entry& e = entries_.back();
    e.core = core;
    try {
      e.thread = std::thread([owned = core]() mutable {
        owned->RunWriter();
        owned.reset();  // the last owner may be this thread: free the sockets now
      });
    } catch (const std::system_error& err) {
      entries_.pop_back();
      return absl::ResourceExhaustedError(absl::StrCat("kv sender writer thread: ", err.what()));
    }
    return absl::OkStatus();
  }

 private:
  struct Entry {
    std::weak_ptr<SessionCore> core;
    std::thread thread;
  };

  // Joins writers that have finished (their join does not block).
  void Reap() {
    std::list<Entry> done;
    {
      absl::MutexLock l(&mu_);
      for (auto it = entries_.begin(); it != entries_.end();) {
        auto next = std::next(it);
        std::shared_ptr<SessionCore> core = it->core.lock();
        if (core == nullptr || core->writer_finished()) done.splice(done.end(), entries_, it);
        it = next;
      }
    }
    for (Entry& e : done) e.thread.join();
  }

  absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tcp

std::unique_ptr<KvSender> TcpKvSender::Create(TcpSenderOptions options) {
  return std::unique_ptr<KvSender>(new TcpKvSender(std::move(options)));
}

TcpKvSender::TcpKvSender(TcpSenderOptions options)
    : options_(std::move(options)), writers_(std::make_unique<tcp::WriterRegistry>()) {}

TcpKvSender::~TcpKvSender() = default;

absl::StatusOr<std::unique_ptr<SendSession>> TcpKvSender::Open(const std::string& endpoint,
                                                               TransferId id,
                                                               const TransferSpec& spec) {
  if (absl::Status s = tcp::ValidateSpec(spec); !s.ok()) return s;
  absl::StatusOr<tcp::HostPort> to = tcp::ParseTcpEndpoint(endpoint);
  if (!to.ok()) return to.status();
  absl::StatusOr<std::unique_ptr<tcp::WakeFd>> wake = tcp::WakeFd::Create();
  if (!wake.ok()) return wake.status();
  const std::string where = absl::StrCat("kv transfer ", id);
  absl::StatusOr<std::shared_ptr<tcp::Connection>> conn =
      tcp::Connection::Connect(*to, absl::Now() + options_.connect_timeout);
  if (!conn.ok()) return tcp::WithContext(conn.status(), where);
  const std::string header = tcp::MakeHeader(id, spec).SerializeAsString();
  if (absl::Status s =
          tcp::WriteFrame(**conn, tcp::FrameType::kHeader,
                          std::as_bytes(std::span<const char>(header.data(), header.size())),
                          absl::Now() + options_.handshake_timeout);
      !s.ok()) {
    return tcp::WithContext(s, absl::StrCat(where, " to ", endpoint, ": sending HEADER"));
  }
  auto core = std::make_shared<tcp::SessionCore>(endpoint, id, spec, options_, std::move(*conn),
                                                 std::move(*wake));
  if (absl::Status s = writers_->Start(core); !s.ok()) return s;
  return std::unique_ptr<SendSession>(new tcp::TcpSendSession(std::move(core)));
}

}  // namespace pdserve::kvtransfer
