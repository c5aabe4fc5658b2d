// POSIX TCP plumbing for the kv transport: tcp:// endpoints, a connected
// stream with deadline-bounded I/O, a listening socket, and an eventfd used to
// wake a thread blocked in poll().
//
// I/O model: descriptors stay in blocking mode, but every send/recv is issued
// with MSG_DONTWAIT and waits in poll() until the caller's absl::Time deadline,
// so no call blocks past its deadline. Sends use MSG_NOSIGNAL (a closed peer is
// an EPIPE status, never SIGPIPE); EINTR and partial transfers are retried.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pdserve::kvtransfer::tcp {

struct HostPort {
  std::string host;  // IPv4/IPv6 literal or a name; IPv6 without brackets
  int port = 0;
};

// Parses "tcp://host:port" or "tcp://[v6addr]:port" (port 1..65535).
// INVALID_ARGUMENT naming the endpoint otherwise.
absl::StatusOr<HostPort> ParseTcpEndpoint(absl::string_view endpoint);
// "tcp://host:port"; an IPv6 host (one containing ':') is bracketed.
std::string FormatTcpEndpoint(absl::string_view host, int port);

// `status` with "`context`: " put before its message; same code. OK stays OK.
absl::Status WithContext(const absl::Status& status, absl::string_view context);

// An eventfd: Signal() from any thread makes fd() readable until Drain().
class WakeFd {
 public:
  static absl::StatusOr<std::unique_ptr<WakeFd>> Create();
  ~WakeFd();
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  int fd() const { return fd_; }
  void Signal();
  void Drain();

 private:
  explicit WakeFd(int fd) : fd_(fd) {}
  const int fd_;
};

// One connected TCP stream. Thread contract: at most one thread reads and one
// writes at a time; Shutdown()/ShutdownWrite() may be called from any thread
// and wake a blocked reader/writer. The descriptor is closed only by the
// destructor, so whoever holds a shared_ptr<Connection> can never act on a
// reused descriptor number.
class Connection {
 public:
  // Takes ownership of the connected socket `fd` and sets TCP_NODELAY.
  explicit Connection(int fd);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Resolves `to` and connects to the first address that accepts before
  // `deadline`. UNAVAILABLE (refused, unreachable, unresolvable) or
  // DEADLINE_EXCEEDED, the message naming host:port.
  static absl::StatusOr<std::shared_ptr<Connection>> Connect(const HostPort& to,
                                                             absl::Time deadline);

  // Writes every byte of `parts`, in order, as one gathered stream.
  absl::Status WriteAll(std::span<const std::span<const std::byte>> parts, absl::Time deadline);
  // Fills `out` completely. UNAVAILABLE "connection closed by peer" on EOF.
  absl::Status ReadExact(std::span<std::byte> out, absl::Time deadline);
  // Fills every span of `parts` completely, in order (a scattered read).
  absl::Status ReadExact(std::span<const std::span<std::byte>> parts, absl::Time deadline);
  // Blocks until the socket is readable (data, EOF or an error: true) or
  // `wake` (may be null) is signalled (false). DEADLINE_EXCEEDED at `deadline`.
  absl::StatusOr<bool> WaitReadable(absl::Time deadline, const WakeFd* wake);
  // True if a read would not block right now (data, EOF or an error pending).
  bool ReadableNow();
  // Bytes received and not read yet (0 on an error); never blocks.
  size_t UnreadBytes();
  // True if the peer closed (or the connection broke) with no data left to
  // read; never blocks.
  bool ClosedByPeerNow();
  // Reads and discards until EOF, an error, or `deadline`. Used for a
  // lingering close: after sending a final message and ShutdownWrite(), the
  // peer's in-flight data is consumed so that close() does not send a RST
  // that could destroy the message before the peer read it.
  void DrainUntilEof(absl::Time deadline);

  void ShutdownWrite();
  // Both directions; blocked and later I/O on this connection fails at once.
  void Shutdown();

  // The descriptor, to watch in an epoll set; only the destructor closes it.
  int fd() const { return fd_; }
  // "address:port" of the peer, for messages.
  const std::string& peer() const { return peer_; }
  // The peer's address alone ("127.0.0.1", "::1"; "?" if unknown).
  const std::string& peer_host() const { return peer_host_; }

 private:
  const int fd_;
  std::string peer_{"?"};
  std::string peer_host_{"?"};
};

// A listening TCP socket (non-blocking, close-on-exec).
class Listener {
 public:
  // Binds `host` (a literal, a name, or "" for every address) and `port`
  // (0 = a free port). INVALID_ARGUMENT for a bad host, UNAVAILABLE when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Listener>> Create(const std::string& host, int port);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int fd() const { return fd_; }
  int port() const { return port_; }
  // One pending connection, or nullptr when none is ready (or it vanished).
  // An error status (EMFILE, ENOBUFS, ...) asks the caller to back off.
  absl::StatusOr<std::shared_ptr<Connection>> Accept();

 private:
  Listener(int fd, int port) : fd_(fd), port_(port) {}
  const int fd_;
  const int port_;
};

}  // namespace pdserve::kvtransfer::tcp
