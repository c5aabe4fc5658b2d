// POSIX TCP plumbing for the kv transport (see socket.h for the I/O model).
#include "kvtransfer/tcp/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pdserve::kvtransfer::tcp {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case EBADF:
    case EFAULT:
    case EINVAL:
    case ENOTSOCK:
      return absl::InternalError(message);
    default:
      return absl::UnavailableError(message);
  }
}

// poll() timeout in milliseconds until `deadline`, rounded up; -1 = forever.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

// Waits until `fd` reports one of `events` (or an error/hangup, which the next
// syscall turns into a status). DEADLINE_EXCEEDED once `deadline` passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (r > 0) return absl::OkStatus();
    if (r == 0) {
      if (absl::Now() >= deadline)
        return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
      continue;
    }
    if (errno != EINTR) return ErrnoStatus(errno, "poll");
  }
}

// The address of `sa` alone; "?" for another family.
std::string SockaddrHost(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, host, sizeof(host));
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, host,
                sizeof(host));
  }
  return host;
}

std::string SockaddrToString(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return absl::StrCat(SockaddrHost(sa), ":",
                        ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    return absl::StrCat("[", SockaddrHost(sa),
                        "]:", ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port));
  }
  return "?";
}

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

absl::StatusOr<AddrInfoPtr> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    const std::string message =
        absl::StrCat("cannot resolve host '", host, "': ", ::gai_strerror(rc));
    return rc == EAI_AGAIN ? absl::UnavailableError(message) : absl::InvalidArgumentError(message);
  }
  return AddrInfoPtr(res);
}

}  // namespace

absl::StatusOr<HostPort> ParseTcpEndpoint(absl::string_view endpoint) {
  constexpr absl::string_view kScheme = "tcp://";
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad kv endpoint '", endpoint, "': ", why, " (want tcp://host:port)"));
  };
  if (endpoint.substr(0, kScheme.size()) != kScheme) return bad("scheme is not tcp://");
  absl::string_view rest = endpoint.substr(kScheme.size());
  HostPort out;
  absl::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return bad("unterminated '['");
    out.host = std::string(rest.substr(1, close - 1));
    rest = rest.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("missing port");
    port_text = rest.substr(1);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return bad("missing port");
    out.host = std::string(rest.substr(0, colon));
    if (out.host.find(':') != std::string::npos) return bad("IPv6 hosts need brackets");
    port_text = rest.substr(colon + 1);
  }
  if (out.host.empty()) return bad("empty host");
  if (out.host.find_first_of("/?#@ ") != std::string::npos) return bad("bad host");
  int port = 0;
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
    return bad("port must be 1..65535");
  }
  out.port = port;
  return out;
}

std::string FormatTcpEndpoint(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("tcp://[", host, "]:", port);
  return absl::StrCat("tcp://", host, ":", port);
}

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// ---- WakeFd ----

absl::StatusOr<std::unique_ptr<WakeFd>> WakeFd::Create() {
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, "eventfd");
  return std::unique_ptr<WakeFd>(new WakeFd(fd));
}

WakeFd::~WakeFd() { ::close(fd_); }

void WakeFd::Signal() {
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated: it is readable anyway.
  while (::write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

void WakeFd::Drain() {
  uint64_t value;
  while (::read(fd_, &value, sizeof(value)) < 0 && errno == EINTR) {
  }
}

// ---- Connection ----

Connection::Connection(int fd) : fd_(fd) {
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    peer_ = SockaddrToString(reinterpret_cast<sockaddr*>(&addr));
    peer_host_ = SockaddrHost(reinterpret_cast<sockaddr*>(&addr));
  }
}

Connection::~Connection() { ::close(fd_); }

absl::StatusOr<std::shared_ptr<Connection>> Connection::Connect(const HostPort& to,
                                                                absl::Time deadline) {
  const std::string where = absl::StrCat("connect to ", FormatTcpEndpoint(to.host, to.port));
  absl::StatusOr<AddrInfoPtr> addrs = Resolve(to.host, to.port, /*passive=*/false);
  if (!addrs.ok())
    return absl::UnavailableError(absl::StrCat(where, ": ", addrs.status().message()));
  absl::Status last = absl::UnavailableError(absl::StrCat(where, ": no address"));
  for (const addrinfo* ai = addrs->get(); ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last = WithContext(ErrnoStatus(errno, "socket"), where);
      continue;
    }
    absl::Status s;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno == EINPROGRESS || errno == EINTR) {
        s = WaitFor(fd, POLLOUT, deadline, "connect");
        if (s.ok()) {
          int err = 0;
          socklen_t len = sizeof(err);
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          if (err != 0) s = ErrnoStatus(err, "connect");
        }
      } else {
        s = ErrnoStatus(errno, "connect");
      }
    }
    if (s.ok()) {
      // Back to blocking mode; per-call MSG_DONTWAIT + poll bound every wait.
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      return std::make_shared<Connection>(fd);
    }
    ::close(fd);
    last = absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
    if (absl::IsDeadlineExceeded(s)) break;
  }
  return last;
}

namespace {

// Sends (or receives) every byte of `iov`, in order, waiting in poll() for
// the socket until `deadline`.
absl::Status MoveAll(int fd, std::vector<iovec> iov, bool send, absl::Time deadline) {
  const char* what = send ? "send" : "recv";
  size_t next = 0;
  while (next < iov.size()) {
    msghdr msg{};
    msg.msg_iov = &iov[next];
    msg.msg_iovlen = std::min<size_t>(iov.size() - next, IOV_MAX);
    const ssize_t n =
        send ? ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) : ::recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n == 0 && !send) return absl::UnavailableError("connection closed by peer");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        absl::Status s = WaitFor(fd, send ? POLLOUT : POLLIN, deadline, what);
        if (!s.ok()) return s;
        continue;
      }
      return ErrnoStatus(errno, what);
    }
    size_t moved = static_cast<size_t>(n);
    while (next < iov.size() && moved >= iov[next].iov_len) moved -= iov[next++].iov_len;
    if (next < iov.size()) {
      iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + moved;
      iov[next].iov_len -= moved;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Connection::WriteAll(std::span<const std::span<const std::byte>> parts,
                                  absl::Time deadline) {
  std::vector<iovec> iov;
  iov.reserve(parts.size());
  for (std::span<const std::byte> p : parts) {
    if (!p.empty()) iov.push_back({const_cast<std::byte*>(p.data()), p.size()});
  }
  return MoveAll(fd_, std::move(iov), /*send=*/true, deadline);
}

absl::Status Connection::ReadExact(std::span<std::byte> out, absl::Time deadline) {
  const std::span<std::byte> parts[] = {out};
  return ReadExact(parts, deadline);
}

absl::Status Connection::ReadExact(std::span<const std::span<std::byte>> parts,
                                   absl::Time deadline) {
  std::vector<iovec> iov;
  iov.reserve(parts.size());
  for (std::span<std::byte> p : parts) {
    if (!p.empty()) iov.push_back({p.data(), p.size()});
  }
  return MoveAll(fd_, std::move(iov), /*send=*/false, deadline);
}

absl::StatusOr<bool> Connection::WaitReadable(absl::Time deadline, const WakeFd* wake) {
  while (true) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake != nullptr ? wake->fd() : -1, POLLIN, 0}};
    const int r = ::poll(fds, wake != nullptr ? 2 : 1, PollTimeoutMs(deadline));
    if (r > 0) {
      if (fds[0].revents != 0) return true;
      return false;
    }
    if (r == 0) {
      if (absl::Now() >= deadline) return absl::DeadlineExceededError("recv timed out");
      continue;
    }
    if (errno != EINTR) return ErrnoStatus(errno, "poll");
  }
}

bool Connection::ReadableNow() {
  pollfd p{fd_, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, 0);
  } while (r < 0 && errno == EINTR);
  return r > 0;
}

size_t Connection::UnreadBytes() {
  int n = 0;
  if (::ioctl(fd_, FIONREAD, &n) != 0 || n < 0) return 0;
  return static_cast<size_t>(n);
}

bool Connection::ClosedByPeerNow() {
  std::byte byte;
  ssize_t n;
  do {
    n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

void Connection::DrainUntilEof(absl::Time deadline) {
  std::array<std::byte, 64 * 1024> sink;
  while (true) {
    const ssize_t n = ::recv(fd_, sink.data(), sink.size(), MSG_DONTWAIT);
    if (n > 0) {
      if (absl::Now() >= deadline) return;  // a peer that never stops sending
      continue;
    }
    if (n == 0) return;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return;
    if (!WaitFor(fd_, POLLIN, deadline, "drain").ok()) return;
  }
}

void Connection::ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }
void Connection::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

// ---- Listener ----

absl::StatusOr<std::unique_ptr<Listener>> Listener::Create(const std::string& host, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("kv receiver port ", port, " not in 0..65535"));
  }
  const std::string where = absl::StrCat("listen on ", FormatTcpEndpoint(host, port));
  absl::StatusOr<AddrInfoPtr> addrs = Resolve(host, port, /*passive=*/true);
  if (!addrs.ok()) return WithContext(addrs.status(), where);
  absl::Status last = absl::UnavailableError(absl::StrCat(where, ": no address"));
  for (const addrinfo* ai = addrs->get(); ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last = WithContext(ErrnoStatus(errno, "socket"), where);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      last = absl::UnavailableError(absl::StrCat(where, ": ", std::strerror(errno)));
      ::close(fd);
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      last = WithContext(ErrnoStatus(errno, "getsockname"), where);
      ::close(fd);
      continue;
    }
    const int bound_port = addr.ss_family == AF_INET6
                               ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                               : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    return std::unique_ptr<Listener>(new Listener(fd, bound_port));
  }
  return last;
}

Listener::~Listener() { ::close(fd_); }

absl::StatusOr<std::shared_ptr<Connection>> Listener::Accept() {
  while (true) {
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return std::make_shared<Connection>(fd);
    switch (errno) {
      case EINTR:
        continue;
      case EAGAIN:
#if EAGAIN != EWOULDBLOCK
      case EWOULDBLOCK:
#endif
      case ECONNABORTED:
      case EPROTO:
      case EPERM:
        return std::shared_ptr<Connection>();
      default:
        return ErrnoStatus(errno, "accept");
    }
  }
}

}  // namespace pdserve::kvtransfer::tcp
