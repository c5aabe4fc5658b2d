// The event thread owns every connection (Conn) and the wait list; a handler
// thread touches only the Conn it was given (its descriptor, to write) and
// gives it back through `returned_`. Conn phases:
//   kHead -> kBody -> kServing -> kHead (kept alive) | closed
//   any reading phase -> kLinger (error answered, draining) -> closed
// Every phase but kServing is on `waiting_` (oldest first: the eviction
// order) and has a deadline.
#include "common/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <list>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "common/memory.h"

namespace pdserve::http {
namespace {

constexpr int kMaxEvents = 256;
constexpr int kMaxAcceptsPerWake = 64;
// How often deadlines are checked (a deadline is met within this).
constexpr absl::Duration kScanInterval = absl::Milliseconds(100);
// After an error answer: how long the client's remaining bytes are read
// and dropped, so that closing does not reset the answer away.
constexpr absl::Duration kLinger = absl::Seconds(1);
// After accept() fails for want of descriptors with nothing to evict.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
// Largest single read into a Content-Length body.
constexpr size_t kBodyReadBytes = 256 * 1024;
// Connection drops are logged at most this often.
constexpr absl::Duration kDropLogInterval = absl::Seconds(10);

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return status < 400 ? "OK" : "Error";
  }
}

std::string PeerOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return addr.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                    : absl::StrCat(host, ":", port);
}

// One non-blocking attempt to send `bytes` (an answer small enough for the
// socket buffer); what does not fit is dropped.
void SendBestEffort(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// Handler threads created on demand, up to a limit: a fixed pool as large as
// the limit would start hundreds of idle threads, and a small one would cap
// concurrent streams at its size. Tasks beyond the limit wait in order.
class GrowingPool {
 public:
  explicit GrowingPool(size_t max_threads) : max_threads_(std::max<size_t>(max_threads, 1)) {}
  ~GrowingPool() { Shutdown(); }

  void Enqueue(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    if (idle_ < queue_.size() && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    }
  }
  // Runs what is queued, then joins every thread.
  void Shutdown() {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  void Work() {
    while (true) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        ++idle_;
        mu_.Await(absl::Condition(this, &GrowingPool::Ready));
        --idle_;
        if (queue_.empty()) return;  // stopping, nothing left
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  const size_t max_threads_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

// ---- ResponseWriter ---------------------------------------------------------

std::string ResponseWriter::HeadBytes(int status, absl::string_view content_type,
                                      const Headers& extra, absl::string_view framing) const {
  std::string head = absl::StrCat("HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\n");
  if (!content_type.empty()) absl::StrAppend(&head, "Content-Type: ", content_type, "\r\n");
  absl::StrAppend(&head, framing, "Connection: ", keep_alive_ ? "keep-alive" : "close", "\r\n");
  for (const auto& [name, value] : extra) absl::StrAppend(&head, name, ": ", value, "\r\n");
  head += "\r\n";
  return head;
}

bool ResponseWriter::WriteAll(absl::string_view a, absl::string_view b, absl::string_view c) {
  if (state_ == State::kBroken) return false;
  absl::string_view parts[3] = {a, b, c};
  int first = 0;
  absl::Time deadline = absl::Now() + write_timeout_;
  while (true) {
    while (first < 3 && parts[first].empty()) ++first;
    if (first == 3) return true;
    iovec iov[3];
    int n = 0;
    for (int i = first; i < 3; ++i) {
      if (parts[i].empty()) continue;
      iov[n].iov_base = const_cast<char*>(parts[i].data());
      iov[n].iov_len = parts[i].size();
      ++n;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) break;
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      pollfd p{fd_, POLLOUT, 0};
      const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
      if (::poll(&p, 1, ms) < 0 && errno != EINTR) break;
      if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) break;
      continue;
    }
    deadline = absl::Now() + write_timeout_;  // progress: the client reads
    for (int i = first; i < 3 && sent > 0; ++i) {
      const size_t take = std::min(parts[i].size(), static_cast<size_t>(sent));
      parts[i].remove_prefix(take);
      sent -= static_cast<ssize_t>(take);
    }
  }
  state_ = State::kBroken;
  return false;
}

bool ResponseWriter::Send(int status, absl::string_view content_type, absl::string_view body,
                          const Headers& extra) {
  if (state_ != State::kNone) return false;
  const std::string head =
      HeadBytes(status, content_type, extra, absl::StrCat("Content-Length: ", body.size(), "\r\n"));
  if (!WriteAll(head, body)) return false;
  state_ = State::kDone;
  return true;
}

bool ResponseWriter::Begin(int status, absl::string_view content_type, const Headers& extra) {
  if (state_ != State::kNone) return false;
  if (!WriteAll(HeadBytes(status, content_type, extra,
                          chunked_ok_ ? "Transfer-Encoding: chunked\r\n" : ""))) {
    return false;
  }
  state_ = State::kStreaming;
  return true;
}

bool ResponseWriter::Write(absl::string_view data) {
  if (state_ != State::kStreaming) return false;
  if (data.empty()) return true;
  if (!chunked_ok_) return WriteAll(data);
  char size[20];
  const int len = snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return WriteAll(absl::string_view(size, len), data, "\r\n");
}

bool ResponseWriter::End() {
  if (state_ != State::kStreaming) return false;
  if (chunked_ok_ && !WriteAll("0\r\n\r\n")) return false;
  state_ = State::kDone;
  return true;
}

bool ResponseWriter::ClientGone() const {
  if (state_ == State::kBroken) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  char byte;
  const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// ---- Server::Impl -----------------------------------------------------------

class Server::Impl {
 public:
  Impl(ServerOptions options, Handler handler, ErrorBody error_body, int listen_fd, int port,
       int epoll_fd, int wake_fd, int cap)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        error_body_(std::move(error_body)),
        listen_fd_(listen_fd),
        port_(port),
        epoll_fd_(epoll_fd),
        wake_fd_(wake_fd),
        cap_(cap),
        pool_(static_cast<size_t>(std::max(1, options_.max_handler_threads))) {}
  ~Impl();

  // Watches the listener and the wake-up descriptor, and starts the
  // event thread.
  void StartLoop();
  int port() const { return port_; }
  ServerStats stats() const;

 private:
  enum class Phase { kHead, kBody, kServing, kLinger, kClosed };
  struct Conn {
    int fd = -1;
    std::string peer;
    Phase phase = Phase::kHead;
    absl::Time deadline;
    bool got_bytes = false;              // of the request now arriving
    std::list<Conn*>::iterator waiting;  // valid unless kServing
    std::string in;                      // received, not yet consumed
    RequestHead head;
    std::string body;
    std::optional<ChunkedBodyDecoder> chunked;
    bool sent_continue = false;
    int requests = 0;
  };
  struct Returned {
    Conn* conn;
    bool keep;
  };

  void Loop();
  void Accept();
  // Closes the connection that has waited longest; false when none waits.
  bool EvictOldest();
  void OnReadable(Conn* c);
  // Consumes c->in as far as it goes; false when `c` was closed or handed
  // to a handler.
  bool Advance(Conn* c);
  void Dispatch(Conn* c);
  void Serve(Conn* c, std::shared_ptr<Request> request, bool keep_alive);
  void TakeBack(const Returned& r);
  // Answers a read error (`status` from the parser) and lingers.
  void Fail(Conn* c, const absl::Status& status);
  void Close(Conn* c);
  void Wait(Conn* c, absl::Time deadline);  // onto the back of waiting_
  void Scan(absl::Time now);
  void Shutdown();
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }

  const ServerOptions options_;
  const Handler handler_;
  const ErrorBody error_body_;
  const int listen_fd_;
  const int port_;
  const int epoll_fd_;
  const int wake_fd_;  // eventfd: a handler gave a connection back, or stop
  const int cap_;

  // Event thread only.
  absl::flat_hash_map<Conn*, std::unique_ptr<Conn>> conns_;
  // Closed during this round of events, freed after it: a later event of
  // the same round may still name them (they are kClosed).
  std::vector<std::unique_ptr<Conn>> closed_;
  std::list<Conn*> waiting_;  // every connection not being served, oldest first
  absl::Time accept_paused_until_ = absl::InfinitePast();
  absl::Time next_drop_log_ = absl::InfinitePast();
  int64_t logged_drops_ = 0;

  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> accepted_{0}, evicted_{0}, refused_{0}, timed_out_{0}, requests_{0};
  std::atomic<int> open_{0};

  absl::Mutex mu_;
  std::vector<Returned> returned_ ABSL_GUARDED_BY(mu_);

  GrowingPool pool_;
  std::thread loop_;  // last: joined first
};

Server::Impl::~Impl() {
  stopping_.store(true);
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    // The eventfd cannot be full at 1; nothing to do.
  }
  if (loop_.joinable()) loop_.join();
  pool_.Shutdown();  // handlers see their connections cut and return
  for (auto& [c, owned] : conns_) ::close(c->fd);
  conns_.clear();
  ::close(listen_fd_);
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

ServerStats Server::Impl::stats() const {
  return {.accepted = accepted_.load(),
          .evicted = evicted_.load(),
          .refused = refused_.load(),
          .timed_out = timed_out_.load(),
          .requests = requests_.load(),
          .open = open_.load(),
          .cap = cap_};
}

void Server::Impl::Loop() {
  epoll_event events[kMaxEvents];
  absl::Time next_scan = absl::Now() + kScanInterval;
  while (true) {
    const int timeout_ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(next_scan - absl::Now()) + 1));
    const int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
    if (n < 0 && errno != EINTR) {
      PDSERVE_LOG(ERROR) << options_.name << ": epoll_wait: " << strerror(errno);
      break;
    }
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &listen_fd_) {
        Accept();
      } else if (tag == &wake_fd_) {
        uint64_t count;
        if (::read(wake_fd_, &count, sizeof(count)) < 0) {
          // Spurious wake-up: nothing to drain.
        }
      } else {
        OnReadable(static_cast<Conn*>(tag));
      }
    }
    if (stopping()) break;
    std::vector<Returned> returned;
    {
      absl::MutexLock lock(&mu_);
      returned.swap(returned_);
    }
    for (const Returned& r : returned) TakeBack(r);
    const absl::Time now = absl::Now();
    if (now >= next_scan) {
      Scan(now);
      next_scan = now + kScanInterval;
    }
    closed_.clear();
  }
  Shutdown();
  closed_.clear();
}

void Server::Impl::StartLoop() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = const_cast<int*>(&listen_fd_);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.ptr = const_cast<int*>(&wake_fd_);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  loop_ = std::thread([this] { Loop(); });
}

void Server::Impl::Shutdown() {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  std::vector<Conn*> all;
  for (auto& [c, owned] : conns_) all.push_back(c);
  for (Conn* c : all) {
    if (c->phase == Phase::kServing) {
      ::shutdown(c->fd, SHUT_RDWR);  // its handler's writes fail; it returns
    } else {
      Close(c);
    }
  }
}

void Server::Impl::Accept() {
  for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (EvictOldest()) continue;
        // Nothing to give up: stop watching the listener for a moment
        // rather than spin on it.
        epoll_event ev{};
        ev.data.ptr = const_cast<int*>(&listen_fd_);
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
        accept_paused_until_ = absl::Now() + kAcceptPause;
      }
      return;
    }
    accepted_.fetch_add(1);
    if (static_cast<int>(conns_.size()) >= cap_ && !EvictOldest()) {
      refused_.fetch_add(1);
      const ErrorResponse e = error_body_ ? error_body_(503, "too many connections")
                                          : ErrorResponse{"text/plain", "too many connections\n"};
      SendBestEffort(fd, absl::StrCat("HTTP/1.1 503 Service Unavailable\r\nContent-Type: ",
                                      e.content_type, "\r\nContent-Length: ", e.body.size(),
                                      "\r\nConnection: close\r\n\r\n", e.body));
      ::close(fd);
      continue;
    }
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    auto owned = std::make_unique<Conn>();
    Conn* c = owned.get();
    c->fd = fd;
    c->peer = PeerOf(fd);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = c;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      continue;
    }
    conns_.emplace(c, std::move(owned));
    open_.store(static_cast<int>(conns_.size()));
    // A new connection's head is due within header_timeout of its accept.
    c->phase = Phase::kHead;
    Wait(c, absl::Now() + options_.header_timeout);
  }
}

bool Server::Impl::EvictOldest() {
  if (waiting_.empty()) return false;
  evicted_.fetch_add(1);
  Close(waiting_.front());
  return true;
}

void Server::Impl::Wait(Conn* c, absl::Time deadline) {
  c->deadline = deadline;
  c->waiting = waiting_.insert(waiting_.end(), c);
}

void Server::Impl::Close(Conn* c) {
  if (c->phase == Phase::kClosed) return;
  if (c->phase != Phase::kServing) waiting_.erase(c->waiting);
  c->phase = Phase::kClosed;
  ::close(c->fd);  // also leaves the epoll set
  auto it = conns_.find(c);
  closed_.push_back(std::move(it->second));
  conns_.erase(it);
  open_.store(static_cast<int>(conns_.size()));
}

void Server::Impl::OnReadable(Conn* c) {
  // An event queued before it left the set, or before it was evicted.
  if (c->phase == Phase::kServing || c->phase == Phase::kClosed) return;
  ssize_t n;
  int error = 0;
  if (c->phase == Phase::kBody && !c->chunked.has_value() && c->in.empty()) {
    // Straight into the body.
    const size_t old = c->body.size();
    const size_t want =
        std::min<size_t>(kBodyReadBytes, static_cast<size_t>(c->head.content_length) - old);
    c->body.resize(old + want);
    do {
      n = ::recv(c->fd, c->body.data() + old, want, 0);
    } while (n < 0 && errno == EINTR);
    error = errno;
    c->body.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
  } else {
    char buf[16 * 1024];
    do {
      n = ::recv(c->fd, buf, sizeof(buf), 0);
    } while (n < 0 && errno == EINTR);
    error = errno;
    if (n > 0 && c->phase != Phase::kLinger) c->in.append(buf, static_cast<size_t>(n));
  }
  if (n < 0 && (error == EAGAIN || error == EWOULDBLOCK)) return;
  if (n <= 0) {  // the client closed, or the connection broke
    Close(c);
    return;
  }
  if (c->phase == Phase::kLinger) return;
  if (!c->got_bytes && c->phase == Phase::kHead) {
    // A kept-alive connection's next request: its head is due from now.
    c->got_bytes = true;
    if (c->requests > 0) c->deadline = absl::Now() + options_.header_timeout;
  }
  Advance(c);
}

bool Server::Impl::Advance(Conn* c) {
  while (true) {
    switch (c->phase) {
      case Phase::kHead: {
        if (c->in.empty()) return true;
        const size_t end = FindHeadEnd(c->in);
        if (end == 0 ? c->in.size() > options_.max_header_bytes : end > options_.max_header_bytes) {
          Fail(c, absl::ResourceExhaustedError(absl::StrCat("request head larger than ",
                                                            options_.max_header_bytes, " bytes")));
          return false;
        }
        if (end == 0) return true;
        absl::StatusOr<RequestHead> head = ParseHead(absl::string_view(c->in).substr(0, end));
        if (!head.ok()) {
          Fail(c, head.status());
          return false;
        }
        c->in.erase(0, end);
        c->head = *std::move(head);
        if (c->head.chunked) {
          c->chunked.emplace(options_.max_body_bytes);
        } else if (c->head.content_length > options_.max_body_bytes) {
          Fail(c, absl::OutOfRangeError(absl::StrCat("request body of ", c->head.content_length,
                                                     " bytes is larger than the limit of ",
                                                     options_.max_body_bytes, " bytes")));
          return false;
        } else if (c->head.content_length == 0) {
          Dispatch(c);
          return false;
        }
        c->phase = Phase::kBody;
        c->deadline = absl::Now() + options_.body_timeout;
        break;
      }
      case Phase::kBody: {
        bool complete = false;
        if (c->chunked.has_value()) {
          size_t consumed = 0;
          absl::StatusOr<bool> done = c->chunked->Feed(c->in, &consumed, &c->body);
          if (!done.ok()) {
            Fail(c, done.status());
            return false;
          }
          c->in.erase(0, consumed);
          complete = *done;
        } else {
          const size_t need = static_cast<size_t>(c->head.content_length) - c->body.size();
          const size_t take = std::min(need, c->in.size());
          c->body.append(c->in, 0, take);
          c->in.erase(0, take);
          complete = c->body.size() == static_cast<size_t>(c->head.content_length);
        }
        if (complete) {
          Dispatch(c);
          return false;
        }
        if (c->head.expect_continue && !c->sent_continue) {
          c->sent_continue = true;
          SendBestEffort(c->fd, "HTTP/1.1 100 Continue\r\n\r\n");
        }
        return true;
      }
      case Phase::kServing:
      case Phase::kLinger:
      case Phase::kClosed:
        return true;
    }
  }
}

void Server::Impl::Dispatch(Conn* c) {
  waiting_.erase(c->waiting);
  c->phase = Phase::kServing;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ++c->requests;
  requests_.fetch_add(1);
  const bool keep = c->head.keep_alive && c->head.minor_version == 1 &&
                    (options_.max_requests_per_connection <= 0 ||
                     c->requests < options_.max_requests_per_connection);
  auto request = std::make_shared<Request>();
  request->head = std::move(c->head);
  request->body = std::move(c->body);
  request->peer = c->peer;
  c->head = RequestHead();
  c->body = std::string();
  c->chunked.reset();
  c->sent_continue = false;
  c->got_bytes = false;
  pool_.Enqueue(
      [this, c, keep, r = std::move(request)]() mutable { Serve(c, std::move(r), keep); });
}

void Server::Impl::Serve(Conn* c, std::shared_ptr<Request> request, bool keep_alive) {
  bool keep = false;
  if (!stopping()) {
    ResponseWriter writer(c->fd, keep_alive, request->head.minor_version >= 1,
                          options_.write_timeout);
    try {
      handler_(*request, writer);
    } catch (const std::exception& e) {
      PDSERVE_LOG(ERROR) << options_.name << ": handler for " << request->head.method << " "
                         << request->head.path << " threw: " << e.what();
    }
    if (!writer.committed()) writer.Send(500, "text/plain", "internal error: no response\n");
    keep = writer.reusable();
  }
  const int64_t body_bytes = static_cast<int64_t>(request->body.size());
  request.reset();
  if (options_.trim_after_body_bytes > 0 && body_bytes >= options_.trim_after_body_bytes) {
    ReleaseFreedMemory();
  }
  {
    absl::MutexLock lock(&mu_);
    returned_.push_back({c, keep});
  }
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    // The counter cannot overflow here; the loop drains it.
  }
}

void Server::Impl::TakeBack(const Returned& r) {
  Conn* c = r.conn;
  if (!r.keep) {
    Close(c);
    return;
  }
  c->phase = Phase::kHead;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = c;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
    c->phase = Phase::kServing;  // not waiting yet
    Close(c);
    return;
  }
  if (c->in.empty()) {
    Wait(c, absl::Now() + options_.idle_timeout);
  } else {  // a pipelined request already arrived, in part or whole
    c->got_bytes = true;
    Wait(c, absl::Now() + options_.header_timeout);
    Advance(c);
  }
}

void Server::Impl::Fail(Conn* c, const absl::Status& status) {
  const int code = HttpStatusOfParseError(status);
  const std::string message(status.message());
  const ErrorResponse e =
      error_body_ ? error_body_(code, message) : ErrorResponse{"text/plain", message + "\n"};
  SendBestEffort(c->fd, absl::StrCat("HTTP/1.1 ", code, " ", ReasonPhrase(code),
                                     "\r\nContent-Type: ", e.content_type, "\r\nContent-Length: ",
                                     e.body.size(), "\r\nConnection: close\r\n\r\n", e.body));
  ::shutdown(c->fd, SHUT_WR);
  c->phase = Phase::kLinger;
  c->in.clear();
  c->body = std::string();
  c->deadline = absl::Now() + kLinger;
}

void Server::Impl::Scan(absl::Time now) {
  if (accept_paused_until_ != absl::InfinitePast() && now >= accept_paused_until_) {
    accept_paused_until_ = absl::InfinitePast();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = const_cast<int*>(&listen_fd_);
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Conn* c = *it++;
    if (now < c->deadline) continue;
    if (c->phase != Phase::kLinger) timed_out_.fetch_add(1);
    Close(c);
  }
  const int64_t drops = evicted_.load() + refused_.load() + timed_out_.load();
  if (drops != logged_drops_ && now >= next_drop_log_) {
    PDSERVE_LOG(WARNING) << options_.name << ": " << drops - logged_drops_
                         << " connections dropped since the last report (totals: evicted "
                         << evicted_.load() << " at the cap of " << cap_ << ", refused "
                         << refused_.load() << ", timed out " << timed_out_.load() << "; open "
                         << conns_.size() << ")";
    logged_drops_ = drops;
    next_drop_log_ = now + kDropLogInterval;
  }
}

// ---- Server -----------------------------------------------------------------

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
int Server::port() const { return impl_->port(); }
ServerStats Server::stats() const { return impl_->stats(); }

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options, Handler handler,
                                                      ErrorBody error_body) {
  if (options.max_connections < 1 || options.header_timeout <= absl::ZeroDuration() ||
      options.body_timeout <= absl::ZeroDuration() ||
      options.idle_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration() || options.max_header_bytes < 256 ||
      options.max_body_bytes < 0 || handler == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(options.name, ": bad options"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options.port);
  if (getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(), port_text.c_str(), &hints,
                  &found) != 0 ||
      found == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(options.name, " cannot resolve ", options.host, ":", options.port));
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only: SO_REUSEPORT would let two servers share a port.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(options.name, " cannot bind ", options.host, ":", options.port));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  const int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd < 0 || wake_fd < 0) {
    ::close(fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
    return absl::ResourceExhaustedError(absl::StrCat(options.name, ": epoll/eventfd failed"));
  }
  // At most half the descriptors the process may open: the rest are the
  // process's own (gRPC, workers, files).
  int cap = options.max_connections;
  if (rlimit limit; getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    cap = static_cast<int>(
        std::min<rlim_t>(static_cast<rlim_t>(cap), std::max<rlim_t>(limit.rlim_cur / 2, 1)));
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler), std::move(error_body),
                                     fd, port, epoll_fd, wake_fd, cap);
  impl->StartLoop();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

}  // namespace pdserve::http
