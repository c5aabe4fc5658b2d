// TCP KvSender (lifetimes and pooling in tcp_sender.h, wire format in
// wire.h).
//
// Per session, the link's thread runs:
//   wait for the handshake ACK (refusal -> FAILED_PRECONDITION with the
//   receiver's text) -> chunk frames as queued, their rows gathered from the
//   source blocks -> FINISH -> final ACK -> done(status).
// Abort() replaces whatever is left with one ABORT frame, then a lingering
// close so the receiver reads the message before the connection goes.
// Status codes: refusal FAILED_PRECONDITION; receiver failure reported by ACK
// ABORTED; lost connection UNAVAILABLE; stalls DEADLINE_EXCEEDED.
#include "kvtransfer/tcp/tcp_sender.h"

#include <poll.h>

#include <deque>
#include <list>
#include <map>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/kv_blocks.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"

namespace pdserve::kvtransfer {
namespace tcp {
namespace {

// After a failed write, how long to look for the receiver's ACK explaining it.
constexpr absl::Duration kExplainTimeout = absl::Milliseconds(200);

// One queued chunk: tokens [token_begin, token_begin + num_tokens) of a
// layer, in `blocks` (the source blocks covering the range; blocks[0] holds
// token `base_token`).
struct Chunk {
  int layer = 0;
  int token_begin = 0;
  int num_tokens = 0;
  int base_token = 0;
  std::vector<int32_t> blocks;
};

// State of one send session, shared by the caller's TcpSendSession and the
// thread of the link that carries it. Caller-side methods are called from
// one thread at a time; RunWriter runs on the link's thread. Once the
// writer has finished (writer_finished_), the connection belongs to the
// next session: nothing here touches it any more.
class SessionCore {
 public:
  SessionCore(std::string endpoint, TransferId id, const TransferSpec& spec,
              const TcpSenderOptions& options, std::span<const engine::KvRegion> regions,
              std::shared_ptr<Connection> conn, std::shared_ptr<WakeFd> wake)
      : endpoint_(std::move(endpoint)),
        id_(id),
        spec_(spec),
        options_(options),
        regions_(regions),
        conn_(std::move(conn)),
        wake_(std::move(wake)),
        next_token_(spec.num_layers, 0) {}

  // ---- Caller side ----
  absl::Status SendLayer(const LayerChunk& chunk);
  void Finish(int32_t first_token, std::function<void(absl::Status)> done);
  void Abort(const absl::Status& why);
  // The TcpSendSession is being destroyed. Without Finish this aborts the
  // transfer and returns once the writer has let go of it (abort_grace,
  // then the connection is cut).
  void Release();
  // The sender is being destroyed: fail now; the writer calls a pending
  // `done` and returns.
  void Shutdown();

  // ---- Link thread ----
  // Runs the session to its end. True when the connection may carry the
  // next transfer (the receiver acknowledged this one). `deliver` gets the
  // call of Finish's `done` (if it was called), for the link to run once it
  // is back in its pool: a caller that opens the next transfer from inside
  // `done` finds the connection idle.
  bool RunWriter(std::function<void()>* deliver);

 private:
  enum class Step { kWait, kChunk, kAbort, kFinish, kExit };

  Step NextStep(Chunk* chunk, int32_t* token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitHandshake();
  void WaitForWork();
  void WriteChunk(const Chunk& chunk);
  absl::Status WriteChunkFrame(const Chunk& chunk);
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
  // Records the first failure, drops queued chunks, stops using the stream.
  void Fail(const absl::Status& why);
  // Waits (abort_grace, then cuts the connection) until no chunk is being
  // written from the source blocks.
  void AwaitNotReading() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Where() const { return absl::StrCat("kv transfer ", id_, " to ", endpoint_); }

  const std::string endpoint_;
  const TransferId id_;
  const TransferSpec spec_;
  const TcpSenderOptions options_;
  const std::span<const engine::KvRegion> regions_;
  const std::shared_ptr<Connection> conn_;
  const std::shared_ptr<WakeFd> wake_;  // signalled whenever the fields below change
  // Writer thread only: frames may still be written (no failure seen on the stream).
  bool usable_ = true;
  std::vector<std::byte> staging_;  // writer thread only: device rows staged for one chunk

  absl::Mutex mu_;
  std::deque<Chunk> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<int> next_token_ ABSL_GUARDED_BY(mu_);  // per layer: tokens queued so far
  absl::Status failure_ ABSL_GUARDED_BY(mu_);         // first error; OK while healthy
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  int32_t first_token_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(absl::Status)> done_ ABSL_GUARDED_BY(mu_);
  bool abort_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool abort_handled_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;         // no more caller calls; exit when idle
  bool in_final_ack_ ABSL_GUARDED_BY(mu_) = false;    // FINISH under way: Abort cuts the stream
  bool reading_ ABSL_GUARDED_BY(mu_) = false;         // a chunk is being written from the blocks
  bool writer_exiting_ ABSL_GUARDED_BY(mu_) = false;  // writer will not take more work
  bool writer_finished_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status SessionCore::SendLayer(const LayerChunk& chunk) {
  const int layer = chunk.layer;
  if (layer < 0 || layer >= spec_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": layer ", layer, " out of range [0, ", spec_.num_layers, ")"));
  }
  const int end = chunk.token_begin + chunk.num_tokens;
  if (chunk.num_tokens <= 0 || chunk.token_begin < 0 || end > spec_.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": layer ", layer, " tokens [",
                                                   chunk.token_begin, ", ", end, ") outside [0, ",
                                                   spec_.num_tokens, ")"));
  }
  const engine::KvRegion& region = regions_[layer];
  if (absl::Status s = CheckBlockTable(region, chunk.block_table, end); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": layer ", layer, ": ", s.message()));
  }
  Chunk queued{.layer = layer,
               .token_begin = chunk.token_begin,
               .num_tokens = chunk.num_tokens,
               .base_token = chunk.token_begin / region.block_size * region.block_size};
  const std::span<const int32_t> blocks =
      BlocksCovering(chunk.block_table, region.block_size, chunk.token_begin, chunk.num_tokens);
  queued.blocks.assign(blocks.begin(), blocks.end());
  {
    absl::MutexLock l(&mu_);
    if (!failure_.ok()) return failure_;
    if (finish_requested_ || abort_requested_ || closing_) {
      return absl::FailedPreconditionError(absl::StrCat(Where(), ": SendLayer after Finish"));
    }
    if (next_token_[layer] == spec_.num_tokens) {
      return absl::AlreadyExistsError(absl::StrCat(Where(), ": layer ", layer, " already sent"));
    }
    if (chunk.token_begin != next_token_[layer]) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), ": layer ", layer,
                                                     " chunk starts at token ", chunk.token_begin,
                                                     ", expected ", next_token_[layer]));
    }
    next_token_[layer] = end;
    queue_.push_back(std::move(queued));
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

void SessionCore::AwaitNotReading() {
  const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !reading_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&idle), options_.abort_grace)) {
    conn_->Shutdown();  // the write is stuck on the network: unblock it
    mu_.Await(absl::Condition(&idle));
  }
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
    if (cut) conn_->Shutdown();
  }
  wake_->Signal();
  absl::MutexLock l(&mu_);
  AwaitNotReading();
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

SessionCore::Step SessionCore::NextStep(Chunk* chunk, int32_t* token) {
  if (!queue_.empty()) {
    *chunk = std::move(queue_.front());
    queue_.pop_front();
    reading_ = true;
    return Step::kChunk;
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

bool SessionCore::RunWriter(std::function<void()>* deliver) {
  wake_->Drain();  // wake-ups meant for the link's previous session
  if (absl::Status s = AwaitHandshake(); !s.ok()) {
    bool aborted = false;
    {
      absl::MutexLock l(&mu_);
      aborted = abort_requested_;
    }
    // An abort during the handshake still sends ABORT (the stream is intact).
    if (!aborted) Fail(s);
  }
  bool reusable = false;
  bool running = true;
  while (running) {
    Chunk chunk;
    int32_t token = 0;
    Step step;
    {
      absl::MutexLock l(&mu_);
      step = NextStep(&chunk, &token);
    }
    switch (step) {
      case Step::kWait:
        WaitForWork();
        break;
      case Step::kChunk: {
        WriteChunk(chunk);
        absl::MutexLock l(&mu_);
        reading_ = false;
        break;
      }
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
          reusable = result.ok() && usable_;
          done = std::move(done_);
        }
        if (!reusable) conn_->Shutdown();
        *deliver = [done = std::move(done), result] {
          if (done) done(result);
        };
        running = false;
        break;
      }
      case Step::kExit:
        running = false;
        break;
    }
  }
  if (!reusable) conn_->Shutdown();
  absl::MutexLock l(&mu_);
  writer_finished_ = true;
  return reusable;
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

absl::Status SessionCore::WriteChunkFrame(const Chunk& chunk) {
  const engine::KvRegion& region = regions_[chunk.layer];
  const int begin = chunk.token_begin - chunk.base_token;
  std::vector<std::span<const std::byte>> rows;
  if (region.memory == engine::MemoryKind::kHost) {
    std::vector<std::span<std::byte>> spans;
    AppendRowSpans(region, chunk.blocks, begin, chunk.num_tokens, &spans);
    rows.assign(spans.begin(), spans.end());
  } else {
    staging_.resize(2 * static_cast<size_t>(region.token_bytes()) * chunk.num_tokens);
    if (absl::Status s = options_.device_staging->ToHost(region, chunk.blocks, begin,
                                                         chunk.num_tokens, staging_);
        !s.ok()) {
      return s;
    }
    rows.emplace_back(staging_);
  }
  return tcp::WriteChunkFrame(*conn_, chunk.layer, chunk.token_begin, chunk.num_tokens,
                              spec_.num_tokens, rows, absl::Now() + options_.io_timeout);
}

void SessionCore::WriteChunk(const Chunk& chunk) {
  if (!usable_) return;
  if (conn_->ReadableNow()) {
    HandleReceiverInput();
    return;
  }
  absl::Status s = WriteChunkFrame(chunk);
  if (!s.ok()) {
    Fail(WriteFailure(s, absl::StrCat("sending layer ", chunk.layer, " tokens [", chunk.token_begin,
                                      ", ", chunk.token_begin + chunk.num_tokens, ")")));
  }
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

  absl::Status SendLayer(const LayerChunk& chunk) override { return core_->SendLayer(chunk); }
  void Finish(int32_t first_token, std::function<void(absl::Status)> done) override {
    core_->Finish(first_token, std::move(done));
  }
  void Abort(const absl::Status& why) override { core_->Abort(why); }

 private:
  const std::shared_ptr<SessionCore> core_;
};

}  // namespace

// One pooled connection and its thread. Fields below `thread` are guarded
// by the pool's mutex.
struct Link {
  Link(std::string endpoint, std::shared_ptr<Connection> conn, std::shared_ptr<WakeFd> wake)
      : endpoint(std::move(endpoint)), conn(std::move(conn)), wake(std::move(wake)) {}

  const std::string endpoint;
  const std::shared_ptr<Connection> conn;
  const std::shared_ptr<WakeFd> wake;
  std::thread thread;
  std::shared_ptr<SessionCore> assigned;  // handed over, not yet taken by the thread
  std::shared_ptr<SessionCore> running;   // the session the thread runs
  bool idle = false;                      // in the endpoint's idle list
  absl::Time idle_since;
  bool retire = false;    // close instead of taking more work
  bool finished = false;  // the thread is exiting; join() will not block
};

// Owns every link of one TcpKvSender. A link's thread holds the pool (shared
// ownership), so a `done` callback that destroys the sender leaves the pool
// alive until that thread returns.
class LinkPool : public std::enable_shared_from_this<LinkPool> {
 public:
  explicit LinkPool(const TcpSenderOptions& options) : options_(options) {}

  // An idle link to `endpoint` that still looks alive (no EOF or stray data
  // pending), taken out of the idle list; null when there is none.
  std::shared_ptr<Link> TakeIdle(const std::string& endpoint) {
    absl::MutexLock l(&mu_);
    auto it = idle_.find(endpoint);
    if (it == idle_.end()) return nullptr;
    std::vector<std::shared_ptr<Link>>& list = it->second;
    while (!list.empty()) {
      std::shared_ptr<Link> link = std::move(list.back());
      list.pop_back();
      link->idle = false;
      if (!link->conn->ReadableNow()) return link;
      link->retire = true;  // the receiver closed it (or broke the protocol)
    }
    return nullptr;
  }

  // Starts the thread of a link over a fresh connection.
  absl::StatusOr<std::shared_ptr<Link>> Start(std::string endpoint,
                                              std::shared_ptr<Connection> conn,
                                              std::shared_ptr<WakeFd> wake) {
    Reap();
    auto link = std::make_shared<Link>(std::move(endpoint), std::move(conn), std::move(wake));
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("kv sender shutting down");
    try {
      link->thread = std::thread([pool = shared_from_this(), link] { pool->Run(link); });
    } catch (const std::system_error& err) {
      return absl::ResourceExhaustedError(absl::StrCat("kv sender link thread: ", err.what()));
    }
    links_.push_back(link);
    return link;
  }

  void Assign(const std::shared_ptr<Link>& link, std::shared_ptr<SessionCore> core) {
    absl::MutexLock l(&mu_);
    link->assigned = std::move(core);
  }

  // The link will not be used: its thread closes it.
  void Retire(const std::shared_ptr<Link>& link) {
    absl::MutexLock l(&mu_);
    link->retire = true;
  }

  // Fails every session, closes every link and joins every thread. Run on a
  // link's own thread (a `done` callback destroying the sender), that one
  // thread is detached instead: it touches only what it co-owns.
  void Shutdown() {
    std::list<std::shared_ptr<Link>> links;
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
      links.swap(links_);
      idle_.clear();
    }
    for (const std::shared_ptr<Link>& link : links) {
      std::shared_ptr<SessionCore> assigned, running;
      {
        absl::MutexLock l(&mu_);
        assigned = link->assigned;
        running = link->running;
      }
      if (assigned != nullptr) assigned->Shutdown();
      if (running != nullptr) running->Shutdown();
      link->conn->Shutdown();
      link->wake->Signal();
    }
    for (const std::shared_ptr<Link>& link : links) {
      if (link->thread.get_id() == std::this_thread::get_id()) {
        link->thread.detach();
      } else {
        link->thread.join();
      }
    }
  }

 private:
  void Run(const std::shared_ptr<Link>& link) {
    while (true) {
      std::shared_ptr<SessionCore> core;
      {
        absl::MutexLock l(&mu_);
        const auto ready = [this, &link]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return link->assigned != nullptr || stopping_ || link->retire;
        };
        const auto ready_or_taken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return ready() || !link->idle;
        };
        while (!ready()) {
          if (!link->idle) {
            mu_.Await(absl::Condition(&ready));
            break;
          }
          const absl::Time deadline = link->idle_since + options_.idle_timeout;
          if (absl::Now() >= deadline) {  // idle too long: leave the list, then close
            std::erase(idle_[link->endpoint], link);
            link->idle = false;
            break;
          }
          mu_.AwaitWithDeadline(absl::Condition(&ready_or_taken), deadline);
        }
        if (link->assigned == nullptr) break;  // stopping, retired, or idle too long
        core = std::move(link->assigned);
        link->running = core;
      }
      std::function<void()> deliver;
      const bool reusable = core->RunWriter(&deliver);
      core.reset();
      bool keep;
      {
        absl::MutexLock l(&mu_);
        link->running.reset();
        std::vector<std::shared_ptr<Link>>& idle = idle_[link->endpoint];
        keep = reusable && !stopping_ && !link->retire &&
               static_cast<int>(idle.size()) < options_.max_idle_connections_per_peer;
        if (keep) {
          link->idle = true;
          link->idle_since = absl::Now();
          idle.push_back(link);
        }
      }
      // May destroy the session or even the sender (see Shutdown); this
      // thread then touches only what it co-owns.
      if (deliver) deliver();
      if (!keep) break;
    }
    link->conn->Shutdown();
    absl::MutexLock l(&mu_);
    link->finished = true;
  }

  // Joins links whose thread has exited (their join does not block).
  void Reap() {
    std::list<std::shared_ptr<Link>> done;
    {
      absl::MutexLock l(&mu_);
      for (auto it = links_.begin(); it != links_.end();) {
        auto next = std::next(it);
        if ((*it)->finished) done.splice(done.end(), links_, it);
        it = next;
      }
    }
    for (const std::shared_ptr<Link>& link : done) link->thread.join();
  }

  const TcpSenderOptions options_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::shared_ptr<Link>>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tcp

absl::StatusOr<std::unique_ptr<KvSender>> TcpKvSender::Create(
    std::span<const engine::KvRegion> regions, TcpSenderOptions options) {
  if (options.max_idle_connections_per_peer < 0 || options.idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("bad TcpSenderOptions");
  }
  for (const engine::KvRegion& r : regions) {
    if (r.memory == engine::MemoryKind::kDevice && options.device_staging == nullptr) {
      return absl::InvalidArgumentError(
          "kv regions in device memory need device staging for the tcp transport");
    }
  }
  return std::make_unique<TcpKvSender>(Private{}, regions, std::move(options));
}

TcpKvSender::TcpKvSender(Private, std::span<const engine::KvRegion> regions,
                         TcpSenderOptions options)
    : regions_(regions),
      options_(std::move(options)),
      links_(std::make_shared<tcp::LinkPool>(options_)) {}

TcpKvSender::~TcpKvSender() { links_->Shutdown(); }

absl::StatusOr<std::unique_ptr<SendSession>> TcpKvSender::Open(const std::string& endpoint,
                                                               TransferId id,
                                                               const TransferSpec& spec) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  if (absl::Status s = CheckRegionsMatch(regions_, spec); !s.ok()) return s;
  absl::StatusOr<tcp::HostPort> to = tcp::ParseTcpEndpoint(endpoint);
  if (!to.ok()) return to.status();
  const std::string where = absl::StrCat("kv transfer ", id);
  const std::string header = MakeHeader(id, spec).SerializeAsString();
  const auto header_bytes = std::as_bytes(std::span<const char>(header.data(), header.size()));
  // An idle pooled connection first; if its HEADER cannot be written (the
  // receiver went away meanwhile), one fresh connection.
  std::shared_ptr<tcp::Link> link = links_->TakeIdle(endpoint);
  while (true) {
    const bool reused = link != nullptr;
    if (!reused) {
      absl::StatusOr<std::unique_ptr<tcp::WakeFd>> wake = tcp::WakeFd::Create();
      if (!wake.ok()) return wake.status();
      absl::StatusOr<std::shared_ptr<tcp::Connection>> conn =
          tcp::Connection::Connect(*to, absl::Now() + options_.connect_timeout);
      if (!conn.ok()) return tcp::WithContext(conn.status(), where);
      absl::StatusOr<std::shared_ptr<tcp::Link>> started =
          links_->Start(endpoint, std::move(*conn), std::move(*wake));
      if (!started.ok()) return started.status();
      link = std::move(*started);
    }
    absl::Status s = tcp::WriteFrame(*link->conn, tcp::FrameType::kHeader, header_bytes,
                                     absl::Now() + options_.handshake_timeout);
    if (s.ok()) break;
    links_->Retire(link);
    link = nullptr;
    if (!reused) {
      return tcp::WithContext(s, absl::StrCat(where, " to ", endpoint, ": sending HEADER"));
    }
  }
  auto core = std::make_shared<tcp::SessionCore>(endpoint, id, spec, options_, regions_, link->conn,
                                                 link->wake);
  links_->Assign(link, core);
  return std::unique_ptr<SendSession>(new tcp::TcpSendSession(std::move(core)));
}

}  // namespace pdserve::kvtransfer
