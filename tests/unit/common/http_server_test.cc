// The HTTP/1.1 server of the OpenAI and metrics ports (common/http_server.h)
// over loopback: framing, keep-alive and pipelining, deadlines, the
// connection cap with oldest-idle eviction, and slow clients that must not
// hold a handler thread. Every wait is bounded; nothing asserts a duration.
#include "common/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/loopback_socket.h"

namespace pdserve::http {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kWait = absl::Seconds(20);

// Echoes "<method> <path> <body>" with a Content-Length.
void Echo(const Request& req, ResponseWriter& out) {
  out.Send(200, "text/plain", absl::StrCat(req.head.method, " ", req.head.path, " ", req.body));
}

std::unique_ptr<Server> StartServer(ServerOptions options, Handler handler = Echo) {
  auto server = Server::Start(std::move(options), std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

void WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    done += static_cast<size_t>(n);
  }
}

// Reads until `want` appears in what arrived, the peer closes, or kWait.
std::string ReadUntil(int fd, const std::string& want, bool* closed = nullptr) {
  std::string out;
  const absl::Time deadline = absl::Now() + kWait;
  if (closed != nullptr) *closed = false;
  while (absl::Now() < deadline && (want.empty() || out.find(want) == std::string::npos)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (closed != nullptr) *closed = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

bool WaitClosed(int fd) {
  bool closed = false;
  ReadUntil(fd, "", &closed);
  return closed;
}

// Polls `done` every 10 ms until it holds or kWait passes.
template <typename F>
bool WaitFor(F done) {
  const absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

TEST(HttpServerTest, KeepAliveAndPipelinedRequestsAreServedInOrder) {
  auto server = StartServer({});
  ASSERT_NE(server, nullptr);
  const int fd = testing::ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  WriteAll(fd, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string first = ReadUntil(fd, "GET /a ");
  EXPECT_THAT(first, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(first, HasSubstr("Connection: keep-alive"));
  // Two requests in one write, the second with a body.
  WriteAll(fd, "GET /b HTTP/1.1\r\n\r\nPOST /c HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  const std::string both = ReadUntil(fd, "POST /c hello");
  EXPECT_LT(both.find("GET /b "), both.find("POST /c hello")) << both;
  // HTTP/1.0 and Connection: close end the connection after the response.
  WriteAll(fd, "GET /d HTTP/1.1\r\nConnection: close\r\n\r\n");
  bool closed = false;
  const std::string last = ReadUntil(fd, "", &closed);
  EXPECT_THAT(last, HasSubstr("Connection: close"));
  EXPECT_THAT(last, HasSubstr("GET /d "));
  EXPECT_TRUE(closed);
  close(fd);
  EXPECT_EQ(server->stats().requests, 4);
}

TEST(HttpServerTest, ChunkedBodiesAndExpectContinue) {
  auto server = StartServer({});
  ASSERT_NE(server, nullptr);
  const int fd = testing::ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  WriteAll(fd, "POST /chunked HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n");
  WriteAll(fd, "2\r\nde\r\n0\r\n\r\n");
  EXPECT_THAT(ReadUntil(fd, "POST /chunked abcde"), HasSubstr("POST /chunked abcde"));
  WriteAll(fd, "POST /big HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_THAT(ReadUntil(fd, "100 Continue\r\n\r\n"), StartsWith("HTTP/1.1 100 Continue"));
  WriteAll(fd, "xyz");
  EXPECT_THAT(ReadUntil(fd, "POST /big xyz"), HasSubstr("200 OK"));
  close(fd);
}

TEST(HttpServerTest, ReadErrorsAreAnsweredWithTheErrorBody) {
  ServerOptions options;
  options.max_body_bytes = 100;
  options.max_header_bytes = 1024;
  auto server = Server::Start(options, Echo, [](int status, absl::string_view message) {
    return ErrorResponse{"application/json",
                         absl::StrCat("{\"status\":", status, ",\"m\":\"", message, "\"}")};
  });
  ASSERT_TRUE(server.ok());
  struct Case {
    std::string request;
    std::string status_line;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", "HTTP/1.1 413", "larger than the limit"},
      {absl::StrCat("GET / HTTP/1.1\r\nX: ", std::string(2000, 'a'), "\r\n\r\n"), "HTTP/1.1 431",
       "head larger"},
      {"hello\r\n\r\n", "HTTP/1.1 400", "malformed"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 501", "gzip"},
      {"GET / HTTP/3.0\r\n\r\n", "HTTP/1.1 505", "HTTP/3.0"},
  };
  for (const Case& c : cases) {
    const int fd = testing::ConnectLoopback((*server)->port());
    ASSERT_GE(fd, 0);
    WriteAll(fd, c.request);
    bool closed = false;
    const std::string response = ReadUntil(fd, "", &closed);
    EXPECT_THAT(response, StartsWith(c.status_line)) << c.request.substr(0, 60);
    EXPECT_THAT(response, HasSubstr("application/json"));
    EXPECT_THAT(response, HasSubstr(c.message));
    EXPECT_TRUE(closed);
    close(fd);
  }
  EXPECT_EQ((*server)->stats().requests, 0);
}

TEST(HttpServerTest, HeadAndIdleDeadlinesCloseConnections) {
  ServerOptions options;
  options.header_timeout = absl::Milliseconds(300);
  options.idle_timeout = absl::Milliseconds(300);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  // A head that never completes, and a connection that says nothing.
  const int partial = testing::ConnectLoopback(server->port());
  const int silent = testing::ConnectLoopback(server->port());
  ASSERT_GE(partial, 0);
  ASSERT_GE(silent, 0);
  WriteAll(partial, "GET / HTTP/1.1\r\nHost:");
  EXPECT_TRUE(WaitClosed(partial));
  EXPECT_TRUE(WaitClosed(silent));
  // A kept-alive connection idle after its response.
  const int idle = testing::ConnectLoopback(server->port());
  ASSERT_GE(idle, 0);
  WriteAll(idle, "GET / HTTP/1.1\r\n\r\n");
  bool closed = false;
  EXPECT_THAT(ReadUntil(idle, "", &closed), HasSubstr("200 OK"));
  EXPECT_TRUE(closed);
  close(partial);
  close(silent);
  close(idle);
  EXPECT_EQ(server->stats().timed_out, 3);
}

TEST(HttpServerTest, SlowClientsHoldNoHandlerThread) {
  ServerOptions options;
  options.max_handler_threads = 1;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  // 200 clients sending their heads a few bytes at a time.
  std::vector<int> slow;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(testing::ConnectLoopback(server->port()));
    ASSERT_GE(slow.back(), 0);
    WriteAll(slow.back(), "GET /slow HTTP/1.1\r\nX-A: ");
  }
  for (int round = 0; round < 3; ++round) {
    const int fd = testing::ConnectLoopback(server->port());
    ASSERT_GE(fd, 0);
    WriteAll(fd, "GET /fast HTTP/1.1\r\n\r\n");
    EXPECT_THAT(ReadUntil(fd, "GET /fast "), HasSubstr("GET /fast ")) << round;
    close(fd);
    for (int s : slow) WriteAll(s, "a");
  }
  EXPECT_EQ(server->stats().requests, 3);
  for (int s : slow) close(s);
}

TEST(HttpServerTest, AtTheCapTheOldestWaitingConnectionMakesRoom) {
  ServerOptions options;
  options.max_connections = 4;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(testing::ConnectLoopback(server->port()));
    ASSERT_GE(idle.back(), 0);
    // Accepted in this order (the cap counts accepted connections).
    ASSERT_TRUE(WaitFor([&] { return server->stats().open == i + 1; }));
  }
  const int fresh = testing::ConnectLoopback(server->port());
  ASSERT_GE(fresh, 0);
  WriteAll(fresh, "GET /new HTTP/1.1\r\n\r\n");
  EXPECT_THAT(ReadUntil(fresh, "GET /new "), HasSubstr("200 OK"));
  EXPECT_TRUE(WaitClosed(idle[0]));  // the oldest
  EXPECT_EQ(server->stats().evicted, 1);
  // The others are still open and served.
  WriteAll(idle[1], "GET /old HTTP/1.1\r\n\r\n");
  EXPECT_THAT(ReadUntil(idle[1], "GET /old "), HasSubstr("200 OK"));
  for (int fd : idle) close(fd);
  close(fresh);
}

TEST(HttpServerTest, AConnectionBeingServedIsNeverEvicted) {
  absl::Notification release;
  std::atomic<int> serving{0};
  ServerOptions options;
  options.max_connections = 2;
  auto server = StartServer(options, [&](const Request& req, ResponseWriter& out) {
    if (req.head.path == "/hold") {
      serving.fetch_add(1);
      release.WaitForNotificationWithTimeout(kWait);
    }
    out.Send(200, "text/plain", req.head.path);
  });
  ASSERT_NE(server, nullptr);
  const int held = testing::ConnectLoopback(server->port());
  ASSERT_GE(held, 0);
  WriteAll(held, "GET /hold HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(WaitFor([&] { return serving.load() == 1; }));
  const int waiting = testing::ConnectLoopback(server->port());
  ASSERT_GE(waiting, 0);
  ASSERT_TRUE(WaitFor([&] { return server->stats().open == 2; }));
  // Full: the waiting connection goes, the one being served stays.
  const int third = testing::ConnectLoopback(server->port());
  ASSERT_GE(third, 0);
  EXPECT_TRUE(WaitClosed(waiting));
  // Full again with the held one and `third`: `third` is waiting, so a
  // fourth connection evicts it; with only served connections left, a
  // newcomer is refused with 503.
  const int fourth = testing::ConnectLoopback(server->port());
  ASSERT_GE(fourth, 0);
  EXPECT_TRUE(WaitClosed(third));
  WriteAll(fourth, "GET /hold HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(WaitFor([&] { return serving.load() == 2; }));
  const int refused = testing::ConnectLoopback(server->port());
  ASSERT_GE(refused, 0);
  bool closed = false;
  EXPECT_THAT(ReadUntil(refused, "", &closed), StartsWith("HTTP/1.1 503"));
  EXPECT_TRUE(closed);
  release.Notify();
  EXPECT_THAT(ReadUntil(held, "/hold"), HasSubstr("200 OK"));
  EXPECT_THAT(ReadUntil(fourth, "/hold"), HasSubstr("200 OK"));
  EXPECT_EQ(server->stats().evicted, 2);
  EXPECT_EQ(server->stats().refused, 1);
  for (int fd : {held, waiting, third, fourth, refused}) close(fd);
}

TEST(HttpServerTest, StreamsAreChunkedAndSeeTheClientLeave) {
  absl::Notification gone;
  auto server = StartServer({}, [&](const Request&, ResponseWriter& out) {
    ASSERT_TRUE(out.Begin(200, "text/event-stream"));
    ASSERT_TRUE(out.Write("data: 1\n\n"));
    const absl::Time deadline = absl::Now() + kWait;
    while (!out.ClientGone() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    if (out.ClientGone()) gone.Notify();
  });
  ASSERT_NE(server, nullptr);
  const int fd = testing::ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  WriteAll(fd, "GET /stream HTTP/1.1\r\n\r\n");
  const std::string head = ReadUntil(fd, "data: 1\n\n\r\n");
  EXPECT_THAT(head, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(head, HasSubstr("9\r\ndata: 1\n\n\r\n"));
  close(fd);
  EXPECT_TRUE(gone.WaitForNotificationWithTimeout(kWait));
}

TEST(HttpServerTest, StoppingCutsConnectionsBeingServed) {
  std::atomic<bool> started{false};
  std::atomic<bool> saw_gone{false};
  auto server = StartServer({}, [&](const Request&, ResponseWriter& out) {
    out.Begin(200, "text/plain");
    started.store(true);
    const absl::Time deadline = absl::Now() + kWait;
    while (absl::Now() < deadline) {
      if (out.ClientGone()) {
        saw_gone.store(true);
        return;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  ASSERT_NE(server, nullptr);
  const int fd = testing::ConnectLoopback(server->port());
  const int idle = testing::ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  ASSERT_GE(idle, 0);
  WriteAll(fd, "GET / HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(WaitFor([&] { return started.load(); }));
  server.reset();  // returns once the handler did
  EXPECT_TRUE(saw_gone.load());
  EXPECT_TRUE(WaitClosed(idle));
  close(fd);
  close(idle);
}

}  // namespace
}  // namespace pdserve::http
