// TCP KvReceiver (threads and sink contract in tcp_receiver.h, wire format in
// wire.h).
//
// Per-connection protocol, as the handler runs it, once per transfer:
//   read HEADER (handshake_timeout for the first, idle_timeout for later
//   ones) -> claim the Expect()ed transfer, check its spec -> ACK{ok} |
//   ACK{false} + lingering close;
//   read LAYER / LAYER_RANGE frames into the blocks, then FINISH (until the
//   transfer's deadline) -> sink.OnLayer for each chunk ->
//   sink.OnComplete(first token) -> final ACK{ok}, and wait for the next
//   HEADER;
//   any failure -> sink.OnComplete(error) -> ACK{false, error} + lingering close.
#include "kvtransfer/tcp/tcp_receiver.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <new>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/kv_blocks.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"

namespace pdserve::kvtransfer {
namespace {

// How often the accept thread reaps exited handler threads and closes
// waiting connections past their deadline.
constexpr int kReapIntervalMs = 100;
constexpr int kMaxEvents = 128;
// epoll data of the listener and the wake-up descriptor; waiting
// connections have ids from 2.
constexpr uint64_t kListenerTag = 0;
constexpr uint64_t kWakeTag = 1;
// How long the accept thread backs off after accept() fails (EMFILE, ...).
constexpr int kAcceptBackoffMs = 100;
// Budget for telling a connection refused at accept time why.
constexpr absl::Duration kOverloadAckTimeout = absl::Milliseconds(100);

}  // namespace

// One Expect()ed transfer. Owned by transfers_ until it completes; handlers,
// Cancel() and the timer hold extra references while they work on it.
struct TcpKvReceiver::Transfer {
  Transfer(TransferId id, const TransferSpec& spec, std::vector<int32_t> blocks,
           std::shared_ptr<ReceiveSink> sink, absl::Duration timeout)
      : id(id),
        spec(spec),
        blocks(std::move(blocks)),
        sink(std::move(sink)),
        timeout(timeout),
        deadline(absl::Now() + timeout) {}

  // Records why the transfer is being stopped from outside (Cancel, shutdown)
  // before its connection is cut; the handler then reports this reason
  // rather than the I/O error the cut causes. The first reason wins.
  void RequestStop(const absl::Status& why) {
    absl::MutexLock l(&stop_mu);
    if (stop_reason.ok()) stop_reason = why;
  }
  absl::Status StopReason() {
    absl::MutexLock l(&stop_mu);
    return stop_reason;
  }

  // Delivers `result` to the sink unless the transfer already completed.
  // Returns whether this call completed it. Never call with mu_ held.
  bool Complete(absl::StatusOr<int32_t> result) {
    absl::MutexLock l(&sink_mu);
    if (completed) return false;
    completed = true;
    outcome = result.status();
    sink->OnComplete(std::move(result));
    return true;
  }
  // Why the transfer completed (OK on success); meaningful once completed.
  absl::Status Outcome() {
    absl::MutexLock l(&sink_mu);
    return outcome;
  }
  std::string Progress() const {
    return absl::StrCat(layers_received.load(), " of ", spec.num_layers, " layers received");
  }
  absl::Status TimeoutError() const {
    return absl::DeadlineExceededError(absl::StrCat("kv transfer ", id, " not complete within ",
                                                    absl::FormatDuration(timeout), " (", Progress(),
                                                    ")"));
  }

  const TransferId id;
  const TransferSpec spec;
  const std::vector<int32_t> blocks;  // destination blocks, from token 0
  const std::shared_ptr<ReceiveSink> sink;
  const absl::Duration timeout;
  const absl::Time deadline;
  // Set once by the handler whose HEADER claims the transfer; from then on that
  // handler owns the deadline. Guarded by the receiver's mu_.
  std::shared_ptr<tcp::Connection> conn;
  std::atomic<int> layers_received{0};  // layers with all their tokens in
  absl::Mutex stop_mu;
  absl::Status stop_reason ABSL_GUARDED_BY(stop_mu);
  // Serialises sink calls and writes into the blocks. Once `completed` is
  // set no write, OnLayer or OnComplete follows.
  absl::Mutex sink_mu;
  bool completed ABSL_GUARDED_BY(sink_mu) = false;
  absl::Status outcome ABSL_GUARDED_BY(sink_mu);
};

// A connection that has sent nothing yet (the accept thread's).
struct TcpKvReceiver::Waiting {
  std::shared_ptr<tcp::Connection> conn;
  absl::Time deadline;  // for its first HEADER
};

// One connection's thread. Fields are guarded by the receiver's mu_.
struct TcpKvReceiver::Handler {
  uint64_t slot = 0;
  std::thread thread;
  std::shared_ptr<tcp::Connection> conn;  // for Shutdown() at destruction; reset on exit
  bool finished = false;                  // the thread is exiting; join() will not block
};

absl::StatusOr<std::unique_ptr<TcpKvReceiver>> TcpKvReceiver::Create(
    const std::string& bind_host, int port, std::span<const engine::KvRegion> regions,
    TcpReceiverOptions options) {
  if (options.max_connections < 1 || options.max_unauthenticated_per_source < 1 ||
      options.max_waiting_connections < 1 || options.max_waiting_per_source < 1 ||
      options.handshake_timeout <= absl::ZeroDuration() || options.linger < absl::ZeroDuration() ||
      options.idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("bad TcpReceiverOptions");
  }
  for (const engine::KvRegion& r : regions) {
    if (r.memory == engine::MemoryKind::kDevice && options.device_staging == nullptr) {
      return absl::InvalidArgumentError(
          "kv regions in device memory need device staging for the tcp transport");
    }
  }
  absl::StatusOr<std::unique_ptr<tcp::Listener>> listener = tcp::Listener::Create(bind_host, port);
  if (!listener.ok()) return listener.status();
  absl::StatusOr<std::unique_ptr<tcp::WakeFd>> wake = tcp::WakeFd::Create();
  if (!wake.ok()) return wake.status();
  std::string host = options.advertise_host.empty() ? bind_host : options.advertise_host;
  if (host.empty()) host = "0.0.0.0";
  const std::string endpoint = tcp::FormatTcpEndpoint(host, (*listener)->port());
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return absl::ResourceExhaustedError("kv receiver: epoll_create1 failed");
  // Waiting connections take at most a quarter of the descriptors.
  int max_waiting = options.max_waiting_connections;
  if (rlimit limit; ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    max_waiting = static_cast<int>(std::min<rlim_t>(static_cast<rlim_t>(max_waiting),
                                                    std::max<rlim_t>(limit.rlim_cur / 4, 1)));
  }
  std::unique_ptr<TcpKvReceiver> receiver(new TcpKvReceiver(std::move(options), regions,
                                                            std::move(*listener), std::move(*wake),
                                                            endpoint, epoll_fd, max_waiting));
  try {
    receiver->accept_thread_ = std::thread([r = receiver.get()] { r->AcceptLoop(); });
    receiver->timer_thread_ = std::thread([r = receiver.get()] { r->TimerLoop(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("kv receiver threads: ", e.what()));
  }
  return receiver;
}

TcpKvReceiver::TcpKvReceiver(TcpReceiverOptions options, std::span<const engine::KvRegion> regions,
                             std::unique_ptr<tcp::Listener> listener,
                             std::unique_ptr<tcp::WakeFd> stop_wake, std::string endpoint,
                             int epoll_fd, int max_waiting)
    : options_(std::move(options)),
      regions_(regions),
      listener_(std::move(listener)),
      stop_wake_(std::move(stop_wake)),
      endpoint_(std::move(endpoint)),
      epoll_fd_(epoll_fd),
      max_waiting_(max_waiting),
      waiting_slots_({.max_connections = max_waiting,
                      .max_unauthenticated_per_source = options_.max_waiting_per_source}),
      slots_({.max_connections = options_.max_connections,
              .max_unauthenticated_per_source = options_.max_unauthenticated_per_source}) {}

TcpKvReceiver::~TcpKvReceiver() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    timer_cv_.SignalAll();
  }
  stop_wake_->Signal();
  if (accept_thread_.joinable()) accept_thread_.join();
  if (timer_thread_.joinable()) timer_thread_.join();
  waiting_.clear();  // closes them
  ::close(epoll_fd_);
  // No new handlers or transfers from here on (stopping_ refuses them).
  std::vector<std::shared_ptr<Transfer>> pending;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, t] : transfers_) pending.push_back(t);
    transfers_.clear();
  }
  // As in Cancel: the reason first, then the connections (which stops
  // writes into the blocks), then the sinks.
  for (const std::shared_ptr<Transfer>& t : pending) {
    t->RequestStop(absl::CancelledError(
        absl::StrCat("kv receiver shutting down: transfer ", t->id, " cancelled")));
  }
  std::list<Handler> handlers;
  {
    absl::MutexLock l(&mu_);
    for (Handler& h : handlers_) {
      if (h.conn != nullptr) h.conn->Shutdown();
    }
    handlers.swap(handlers_);  // list nodes (and Handler*) stay valid
  }
  for (const std::shared_ptr<Transfer>& t : pending) t->Complete(t->StopReason());
  for (Handler& h : handlers) h.thread.join();
}

absl::Status TcpKvReceiver::Expect(TransferId id, const TransferSpec& spec,
                                   std::vector<int32_t> block_table,
                                   std::shared_ptr<ReceiveSink> sink, absl::Duration timeout) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  if (absl::Status s = CheckRegionsMatch(regions_, spec); !s.ok()) return s;
  for (const engine::KvRegion& r :
       regions_.first(std::min<size_t>(regions_.size(), spec.num_layers))) {
    if (absl::Status s = CheckBlockTable(r, block_table, spec.num_tokens); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Expect: ", s.message()));
    }
  }
  if (sink == nullptr) return absl::InvalidArgumentError("Expect: null sink");
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Expect: timeout must be positive, got ", absl::FormatDuration(timeout)));
  }
  auto t = std::make_shared<Transfer>(id, spec, std::move(block_table), std::move(sink), timeout);
  absl::MutexLock l(&mu_);
  if (stopping_) return absl::FailedPreconditionError("kv receiver is shutting down");
  if (!transfers_.try_emplace(id, std::move(t)).second) {
    return absl::AlreadyExistsError(absl::StrCat("kv transfer ", id, " is already expected"));
  }
  timer_cv_.Signal();
  return absl::OkStatus();
}

void TcpKvReceiver::Cancel(TransferId id) {
  std::shared_ptr<Transfer> t;
  std::shared_ptr<tcp::Connection> conn;
  {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(id);
    if (it == transfers_.end()) return;
    t = std::move(it->second);
    transfers_.erase(it);
    conn = t->conn;
  }
  // The reason first, so the handler's reaction to the cut reports it; the
  // cut stops a write into the blocks; Complete waits for that write to
  // return, and `completed` stops the handler's later writes and sink calls.
  const absl::Status why =
      absl::CancelledError(absl::StrCat("kv transfer ", id, " cancelled by the receiver"));
  t->RequestStop(why);
  if (conn != nullptr) conn->Shutdown();
  t->Complete(why);
}

bool TcpKvReceiver::Finalize(const std::shared_ptr<Transfer>& t, absl::StatusOr<int32_t> result) {
  {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(t->id);
    if (it != transfers_.end() && it->second == t) transfers_.erase(it);
  }
  return t->Complete(std::move(result));
}

void TcpKvReceiver::TimerLoop() {
  mu_.Lock();
  while (!stopping_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    std::vector<std::shared_ptr<Transfer>> expired;
    for (const auto& [id, t] : transfers_) {
      if (t->conn != nullptr) continue;  // claimed: its handler enforces the deadline
      if (t->deadline <= now) {
        expired.push_back(t);
      } else {
        next = std::min(next, t->deadline);
      }
    }
    if (expired.empty()) {
      timer_cv_.WaitWithDeadline(&mu_, next);
      continue;
    }
    for (const std::shared_ptr<Transfer>& t : expired) transfers_.erase(t->id);
    mu_.Unlock();
    for (const std::shared_ptr<Transfer>& t : expired) t->Complete(t->TimeoutError());
    expired.clear();
    mu_.Lock();
  }
  mu_.Unlock();
}

void TcpKvReceiver::AcceptLoop() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerTag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listener_->fd(), &ev);
  ev.data.u64 = kWakeTag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, stop_wake_->fd(), &ev);
  epoll_event events[kMaxEvents];
  absl::Time listener_paused_until = absl::InfinitePast();
  while (true) {
    const int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, kReapIntervalMs);
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    ReapFinishedHandlers();
    const absl::Time now = absl::Now();
    ExpireWaiting(now);
    if (listener_paused_until != absl::InfinitePast() && now >= listener_paused_until) {
      listener_paused_until = absl::InfinitePast();
      ev.events = EPOLLIN;
      ev.data.u64 = kListenerTag;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listener_->fd(), &ev);
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kListenerTag) {
        AcceptReady();
        continue;
      }
      if (tag == kWakeTag) continue;  // stop: checked above
      // A waiting connection's first bytes (or its close) arrived.
      auto it = waiting_.find(tag);
      if (it == waiting_.end()) continue;  // closed earlier in this round
      Waiting w = std::move(it->second);
      waiting_.erase(it);
      waiting_slots_.Release(tag);
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, w.conn->fd(), nullptr);
      if (w.conn->ClosedByPeerNow()) continue;  // it left: no thread for it
      StartHandler(std::move(w.conn), w.deadline);
    }
    // Out of descriptors with none waiting to give up: stop watching the
    // listener a moment rather than spin on it.
    if (accept_paused_ && listener_paused_until == absl::InfinitePast()) {
      accept_paused_ = false;
      listener_paused_until = absl::Now() + absl::Milliseconds(kAcceptBackoffMs);
      ev.events = 0;
      ev.data.u64 = kListenerTag;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listener_->fd(), &ev);
    }
  }
}

void TcpKvReceiver::AcceptReady() {
  for (int i = 0; i < kMaxEvents; ++i) {
    absl::StatusOr<std::shared_ptr<tcp::Connection>> accepted = listener_->Accept();
    if (!accepted.ok()) {
      // Out of descriptors or memory: a waiting stranger gives its up.
      if (EvictOldestWaiting()) continue;
      accept_paused_ = true;
      return;
    }
    if (*accepted == nullptr) return;  // none left
    std::shared_ptr<tcp::Connection> conn = *std::move(accepted);
    {
      absl::MutexLock l(&mu_);
      ++connections_accepted_;
    }
    const uint64_t id = next_waiting_++;
    tcp::ConnectionSlots::Admission admission =
        waiting_slots_.Admit(id, conn->peer_host(), [](uint64_t) { return false; });
    for (uint64_t evicted : admission.evicted) {
      auto it = waiting_.find(evicted);
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.conn->fd(), nullptr);
      waiting_.erase(it);  // closes it
    }
    if (!admission.evicted.empty()) {
      absl::MutexLock l(&mu_);
      connections_evicted_ += static_cast<int>(admission.evicted.size());
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, conn->fd(), &ev) != 0) {
      waiting_slots_.Release(id);
      continue;
    }
    waiting_.emplace(id, Waiting{std::move(conn), absl::Now() + options_.handshake_timeout});
  }
}

bool TcpKvReceiver::EvictOldestWaiting() {
  if (waiting_.empty()) return false;
  // The lowest id is the oldest.
  auto oldest = std::min_element(waiting_.begin(), waiting_.end(),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, oldest->second.conn->fd(), nullptr);
  waiting_slots_.Release(oldest->first);
  waiting_.erase(oldest);
  absl::MutexLock l(&mu_);
  ++connections_evicted_;
  return true;
}

void TcpKvReceiver::ExpireWaiting(absl::Time now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, w] : waiting_) {
    if (now >= w.deadline) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    auto it = waiting_.find(id);
    tcp::Connection& conn = *it->second.conn;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn.fd(), nullptr);
    // One attempt to say why (the socket buffer of a silent peer is empty).
    tcp::WriteAckFrame(conn,
                       absl::DeadlineExceededError(absl::StrCat(
                           "kv receiver ", endpoint_, ": no HEADER within ",
                           absl::FormatDuration(options_.handshake_timeout), " of connecting")),
                       now)
        .IgnoreError();
    waiting_slots_.Release(id);
    waiting_.erase(it);
  }
}

void TcpKvReceiver::StartHandler(std::shared_ptr<tcp::Connection> conn, absl::Time deadline) {
  std::string refusal;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    const uint64_t slot = next_slot_++;
    // A connection with a whole frame header waiting is about to
    // authenticate (a sender writes its HEADER at once); one with less is a
    // talker that stalled, whether or not its handler has read its bytes yet
    // (on a busy machine it may not have been scheduled).
    tcp::ConnectionSlots::Admission admission =
        slots_.Admit(slot, conn->peer_host(), [this](uint64_t id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return slot_handlers_.at(id)->conn->UnreadBytes() >= tcp::kFrameHeaderBytes;
        });
    for (uint64_t evicted : admission.evicted) {
      // Its handler sees the cut, fails its handshake and exits.
      Handler* victim = slot_handlers_.at(evicted);
      slot_handlers_.erase(evicted);
      victim->conn->Shutdown();
      ++connections_evicted_;
    }
    if (admission.admitted) {
      handlers_.emplace_back();
      Handler* h = &handlers_.back();
      h->slot = slot;
      h->conn = conn;
      try {
        h->thread = std::thread([this, h, conn, slot, deadline] {
          HandleConnection(conn, slot, deadline);
          absl::MutexLock l(&mu_);
          h->finished = true;
          h->conn.reset();
          slots_.Release(slot);
          if (auto it = slot_handlers_.find(slot); it != slot_handlers_.end() && it->second == h) {
            slot_handlers_.erase(it);
          }
        });
        slot_handlers_[slot] = h;
        return;
      } catch (const std::system_error&) {
        handlers_.pop_back();
        slots_.Release(slot);
        refusal = "cannot start a connection thread";
      }
    } else {
      refusal = std::move(admission.refusal);
    }
    ++connections_refused_;
  }
  // No slot (or out of threads): refuse without holding up the accept loop.
  tcp::WriteAckFrame(*conn,
                     absl::UnavailableError(absl::StrCat("kv receiver ", endpoint_,
                                                         " at connection capacity: ", refusal)),
                     absl::Now() + kOverloadAckTimeout)
      .IgnoreError();
  conn->Shutdown();
}

void TcpKvReceiver::ReapFinishedHandlers() {
  std::list<Handler> done;
  {
    absl::MutexLock l(&mu_);
    for (auto it = handlers_.begin(); it != handlers_.end();) {
      auto next = std::next(it);
      if (it->finished) done.splice(done.end(), handlers_, it);
      it = next;
    }
  }
  for (Handler& h : done) h.thread.join();
}

void TcpKvReceiver::HandleConnection(const std::shared_ptr<tcp::Connection>& conn, uint64_t slot,
                                     absl::Time first_deadline) {
  for (bool first = true;; first = false) {
    if (!first) {
      // Between transfers: the sender keeps the connection in its pool.
      absl::StatusOr<bool> readable =
          conn->WaitReadable(absl::Now() + options_.idle_timeout, nullptr);
      if (!readable.ok()) {
        conn->Shutdown();
        return;
      }
    }
    // The first HEADER is due within handshake_timeout of the accept; a
    // later one (a pooled connection) within it of its first bytes.
    absl::StatusOr<std::shared_ptr<Transfer>> claimed =
        Claim(conn, slot, first ? first_deadline : absl::Now() + options_.handshake_timeout);
    if (!claimed.ok()) {
      RefuseAndClose(*conn, claimed.status());
      return;
    }
    const std::shared_ptr<Transfer>& t = *claimed;
    absl::StatusOr<int32_t> result = absl::UnknownError("unset");
    if (absl::Status s =
            tcp::WriteAckFrame(*conn, absl::OkStatus(), absl::Now() + options_.handshake_timeout);
        !s.ok()) {
      result = tcp::WithContext(s, absl::StrCat("kv transfer ", t->id, ": sending handshake ACK"));
    } else {
      result = ReceiveLayers(*t, *conn);
    }
    if (!result.ok()) {
      // Cut from outside (Cancel, shutdown): report why, not the cut.
      if (absl::Status stop = t->StopReason(); !stop.ok()) result = stop;
    }
    const bool completed_here = Finalize(t, result);
    // If Cancel() or shutdown got there first, tell the sender that reason.
    const absl::Status outcome = completed_here ? result.status() : t->Outcome();
    if (!outcome.ok()) {
      RefuseAndClose(*conn, outcome);
      return;
    }
    if (!tcp::WriteAckFrame(*conn, outcome, absl::Now() + options_.handshake_timeout).ok()) {
      conn->Shutdown();
      return;
    }
  }
}

absl::StatusOr<std::shared_ptr<TcpKvReceiver::Transfer>> TcpKvReceiver::Claim(
    const std::shared_ptr<tcp::Connection>& conn, uint64_t slot, absl::Time deadline) {
  const std::string from = absl::StrCat("kv sender ", conn->peer());
  absl::StatusOr<tcp::FrameHeader> frame = tcp::ReadFrameHeader(*conn, deadline);
  if (!frame.ok()) return tcp::WithContext(frame.status(), from + ": reading HEADER");
  if (frame->type != tcp::FrameType::kHeader) {
    return absl::InvalidArgumentError(
        absl::StrCat(from, ": expected a HEADER frame, got ", tcp::FrameTypeName(frame->type)));
  }
  absl::StatusOr<std::string> payload = tcp::ReadControlPayload(*conn, *frame, deadline);
  if (!payload.ok()) return tcp::WithContext(payload.status(), from + ": reading HEADER");
  internal::v1::KvTransferHeader header;
  if (!header.ParseFromString(*payload)) {
    return absl::InvalidArgumentError(from + ": malformed HEADER frame");
  }
  if (absl::Status s = CheckPeerCredential(header); !s.ok()) {
    return tcp::WithContext(s, from);
  }
  {
    absl::MutexLock l(&mu_);
    if (!slots_.Authenticate(slot)) {
      return absl::UnavailableError(
          absl::StrCat(from, ": connection closed to make room during its handshake"));
    }
  }
  const TransferId id = header.transfer_id();
  std::shared_ptr<Transfer> t;
  absl::Status refusal;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("kv receiver is shutting down");
    auto it = transfers_.find(id);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown transfer id ", id, " at kv receiver ",
                                              endpoint_, " (not expected, expired or cancelled)"));
    }
    if (it->second->conn != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("kv transfer ", id, " already has a sender connection"));
    }
    t = it->second;
    refusal = CheckHeader(header, t->spec);
    if (refusal.ok()) {
      t->conn = conn;
      return t;
    }
    transfers_.erase(it);
  }
  // The right transfer with the wrong shape: it can never succeed, so it
  // fails here too rather than waiting for its deadline.
  refusal = tcp::WithContext(refusal, absl::StrCat("kv transfer ", id, " from ", conn->peer()));
  t->Complete(refusal);
  return refusal;
}

absl::Status TcpKvReceiver::ReadChunk(Transfer& t, tcp::Connection& conn, int layer, int begin,
                                      int count, bool* io_error) {
  *io_error = true;
  const engine::KvRegion& region = regions_[layer];
  std::vector<std::byte> staged;  // device regions: the rows, before they go to the device
  if (region.memory == engine::MemoryKind::kDevice) {
    try {
      staged.resize(2 * static_cast<size_t>(region.token_bytes()) * count);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", 2 * region.token_bytes() * count, " staging bytes"));
    }
    if (absl::Status s = conn.ReadExact(std::span<std::byte>(staged), t.deadline); !s.ok()) {
      return s;
    }
  }
  absl::MutexLock l(&t.sink_mu);
  if (t.completed) {  // cancelled or shut down meanwhile: hands off the blocks
    *io_error = false;
    return t.outcome;
  }
  if (region.memory == engine::MemoryKind::kDevice) {
    if (absl::Status s = options_.device_staging->FromHost(region, t.blocks, begin, count, staged);
        !s.ok()) {
      return s;
    }
  } else {
    std::vector<std::span<std::byte>> rows;
    AppendRowSpans(region, t.blocks, begin, count, &rows);
    if (absl::Status s = conn.ReadExact(rows, t.deadline); !s.ok()) return s;
  }
  *io_error = false;
  return t.sink->OnLayer(layer, begin, count);
}

absl::StatusOr<int32_t> TcpKvReceiver::ReceiveLayers(Transfer& t, tcp::Connection& conn) {
  const TransferSpec& spec = t.spec;
  const int total = spec.num_tokens;
  const std::string where = absl::StrCat("kv transfer ", t.id, " from ", conn.peer());
  std::vector<int> next(spec.num_layers, 0);  // per layer: tokens received
  int received = 0;                           // layers with all their tokens
  // Read errors past the deadline report the timeout, not the I/O symptom.
  auto read_error = [&](const absl::Status& s, absl::string_view what) -> absl::Status {
    if (absl::IsDeadlineExceeded(s) || absl::Now() >= t.deadline) return t.TimeoutError();
    return tcp::WithContext(s, absl::StrCat(where, ": ", what, " after ", received, " of ",
                                            spec.num_layers, " layers"));
  };
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
  };
  while (true) {
    if (absl::Now() >= t.deadline) return t.TimeoutError();
    absl::StatusOr<tcp::FrameHeader> frame = tcp::ReadFrameHeader(conn, t.deadline);
    if (!frame.ok()) {
      if (absl::IsInvalidArgument(frame.status())) return invalid(frame.status().message());
      return read_error(frame.status(), "reading a frame");
    }
    switch (frame->type) {
      case tcp::FrameType::kLayer:
      case tcp::FrameType::kLayerRange: {
        const bool whole = frame->type == tcp::FrameType::kLayer;
        const size_t prefix = whole ? tcp::kLayerIndexBytes : tcp::kRangePrefixBytes;
        if (whole && frame->length != prefix + spec.LayerBytes()) {
          return invalid(absl::StrCat("LAYER frame of ", frame->length, " bytes, expected ",
                                      prefix + spec.LayerBytes()));
        }
        std::array<std::byte, tcp::kRangePrefixBytes> prefix_bytes;
        if (absl::Status s = conn.ReadExact(std::span(prefix_bytes).first(prefix), t.deadline);
            !s.ok()) {
          return read_error(s, "reading a LAYER frame");
        }
        const uint32_t layer = tcp::GetU32(prefix_bytes.data());
        if (layer >= static_cast<uint32_t>(spec.num_layers)) {
          return invalid(
              absl::StrCat("layer index ", layer, " out of range [0, ", spec.num_layers, ")"));
        }
        const uint32_t begin = whole ? 0 : tcp::GetU32(prefix_bytes.data() + 4);
        const uint32_t count = whole ? total : tcp::GetU32(prefix_bytes.data() + 8);
        if (next[layer] == total) return invalid(absl::StrCat("duplicate layer ", layer));
        if (begin != static_cast<uint32_t>(next[layer]) || count == 0 ||
            count > static_cast<uint32_t>(total - next[layer])) {
          return invalid(absl::StrCat("layer ", layer, " tokens [", begin, ", +", count,
                                      ") do not continue its ", next[layer], " of ", total,
                                      " tokens"));
        }
        if (frame->length != prefix + 2 * spec.TokenBytes() * count) {
          return invalid(absl::StrCat(tcp::FrameTypeName(frame->type), " frame of ", frame->length,
                                      " bytes, expected ", prefix + 2 * spec.TokenBytes() * count));
        }
        bool io_error = false;
        if (absl::Status s = ReadChunk(t, conn, static_cast<int>(layer), static_cast<int>(begin),
                                       static_cast<int>(count), &io_error);
            !s.ok()) {
          if (io_error) return read_error(s, absl::StrCat("reading layer ", layer));
          if (absl::Status stop = t.StopReason(); !stop.ok()) return stop;
          return tcp::WithContext(s, absl::StrCat(where, ": kv sink rejected layer ", layer));
        }
        next[layer] += static_cast<int>(count);
        if (next[layer] == total) t.layers_received.store(++received);
        break;
      }
      case tcp::FrameType::kFinish: {
        std::array<std::byte, tcp::kFinishPayloadBytes> token_bytes;
        if (absl::Status s = conn.ReadExact(token_bytes, t.deadline); !s.ok()) {
          return read_error(s, "reading FINISH");
        }
        if (received != spec.num_layers) {
          const auto missing =
              std::find_if(next.begin(), next.end(), [total](int n) { return n != total; }) -
              next.begin();
          return absl::FailedPreconditionError(
              absl::StrCat(where, ": FINISH after ", received, " of ", spec.num_layers,
                           " layers (layer ", missing, " missing)"));
        }
        return static_cast<int32_t>(tcp::GetU32(token_bytes.data()));
      }
      case tcp::FrameType::kAbort: {
        absl::StatusOr<std::string> message = tcp::ReadControlPayload(conn, *frame, t.deadline);
        if (!message.ok()) return read_error(message.status(), "reading ABORT");
        return absl::AbortedError(absl::StrCat("kv sender aborted transfer ", t.id, ": ",
                                               tcp::SanitizeUtf8(*message, 4096)));
      }
      case tcp::FrameType::kHeader:
      case tcp::FrameType::kAck:
        return invalid(absl::StrCat("unexpected ", tcp::FrameTypeName(frame->type),
                                    " frame after the handshake"));
    }
  }
}

void TcpKvReceiver::RefuseAndClose(tcp::Connection& conn, const absl::Status& why) {
  const absl::Time now = absl::Now();
  if (tcp::WriteAckFrame(conn, why, now + options_.handshake_timeout).ok()) {
    conn.ShutdownWrite();
    conn.DrainUntilEof(now + options_.linger);
  }
  conn.Shutdown();
}

}  // namespace pdserve::kvtransfer
