// Test helper: a raw TCP connection to 127.0.0.1, for tests that must hold
// a connection in a state an HTTP client library would not leave it in
// (idle keep-alive, connected but silent).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace pdserve::testing {

// A connected socket to 127.0.0.1:`port` whose reads time out after
// `read_timeout_s`; -1 on failure. The caller closes it.
inline int ConnectLoopback(int port, int read_timeout_s = 10) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval timeout{.tv_sec = read_timeout_s, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

}  // namespace pdserve::testing
