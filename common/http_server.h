// A small HTTP/1.1 server whose open connections cost no thread until a
// whole request has arrived, for the OpenAI port and the metrics port.
//
// One event thread (epoll) accepts connections and reads every request's
// head and body under deadlines: the head within `header_timeout` of its
// first byte (of the accept for a new connection), the body within
// `body_timeout` of the head, the next request on a kept-alive connection
// within `idle_timeout`. A connection that misses its deadline is closed.
// Only a complete request goes to a handler thread (a pool that grows on
// demand up to `max_handler_threads`), which writes the response and hands
// the connection back for the next request. So a client that sends its
// headers one byte a second (slowloris) holds a descriptor and a few bytes,
// never a handler thread.
//
// Connection cap: at most `max_connections` connections are open (and never
// more than half of the process's descriptor limit, RLIMIT_NOFILE). A new
// connection beyond it, or one accepted when the process is out of
// descriptors, closes the connection that has waited longest without a
// request being served (idle keep-alive, or a request still arriving);
// connections whose request a handler is serving are never evicted. When
// every connection is being served the new one gets 503 and is closed.
//
// Protocol: HTTP/1.0 and 1.1, keep-alive, pipelined requests (served one
// after another), Content-Length and chunked request bodies, Expect:
// 100-continue. Responses have a Content-Length, or are chunked (streams).
// Errors found while reading (400 malformed, 413 body too large, 431 head
// too large, 501 unknown transfer coding, 505 version) are answered with the
// body `error_body` makes, then the connection is closed after a short
// lingering read so the client sees the answer.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/http_parser.h"

namespace pdserve::http {

struct Request {
  RequestHead head;
  std::string body;
  std::string peer;  // "address:port" of the client
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// Writes one response, on the handler's thread. Every write waits at most
// `write_timeout` for the client to take bytes; a write that fails or times
// out returns false and breaks the connection (later writes fail at once).
class ResponseWriter {
 public:
  // Writes to the connected socket `fd` (non-blocking), which it does not
  // own. `keep_alive`: the connection stays open after this response.
  // `chunked_ok`: the client speaks HTTP/1.1 (an HTTP/1.0 client gets a
  // stream unframed, ended by closing the connection).
  ResponseWriter(int fd, bool keep_alive, bool chunked_ok, absl::Duration write_timeout)
      : fd_(fd),
        keep_alive_(keep_alive && chunked_ok),
        chunked_ok_(chunked_ok),
        write_timeout_(write_timeout) {}

  // A whole response with a Content-Length.
  bool Send(int status, absl::string_view content_type, absl::string_view body,
            const Headers& extra = {});
  // A chunked response: the head now, then Write() each piece, then End().
  bool Begin(int status, absl::string_view content_type, const Headers& extra = {});
  bool Write(absl::string_view data);  // one chunk; empty data writes nothing
  bool End();

  // True once the client closed its side or the connection broke (a peek:
  // pipelined bytes of a next request do not count). Cheap; poll it while
  // waiting.
  bool ClientGone() const;
  // A response began (Send or Begin was called).
  bool committed() const { return state_ != State::kNone; }
  // The whole response went out (Send, or Begin ... End) and the connection
  // may carry another request.
  bool reusable() const { return state_ == State::kDone && keep_alive_; }

 private:
  enum class State { kNone, kStreaming, kDone, kBroken };
  bool WriteAll(absl::string_view a, absl::string_view b = {}, absl::string_view c = {});
  std::string HeadBytes(int status, absl::string_view content_type, const Headers& extra,
                        absl::string_view framing) const;

  const int fd_;
  const bool keep_alive_;  // the request and the server allow another request
  const bool chunked_ok_;
  const absl::Duration write_timeout_;
  State state_ = State::kNone;
};

using Handler = std::function<void(const Request&, ResponseWriter&)>;
// The body (and its content type) of an error response the server makes on
// its own, from its HTTP status and a message.
struct ErrorResponse {
  std::string content_type;
  std::string body;
};
using ErrorBody = std::function<ErrorResponse(int status, absl::string_view message)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                      // 0: any free port
  std::string name = "HTTP server";  // in messages
  int max_connections = 1024;
  int max_handler_threads = 64;
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(60);
  absl::Duration idle_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  size_t max_header_bytes = 64 * 1024;
  int64_t max_body_bytes = int64_t{64} << 20;
  // Requests served per connection before it is closed; 0: no limit.
  int max_requests_per_connection = 0;
  // After a request body of at least this many bytes, freed heap memory is
  // handed back to the system (common/memory.h); 0: never.
  int64_t trim_after_body_bytes = int64_t{1} << 20;
};

// What the server did to connections, since it started.
struct ServerStats {
  int64_t accepted = 0;
  int64_t evicted = 0;    // closed to make room for a new connection
  int64_t refused = 0;    // 503 at the cap, every connection being served
  int64_t timed_out = 0;  // missed a head, body or idle deadline
  int64_t requests = 0;   // handed to the handler
  int open = 0;           // open now
  int cap = 0;            // the effective connection cap
};

class Server {
 public:
  // Binds and starts serving. `error_body` may be empty (plain text).
  // UNAVAILABLE when the address cannot be bound, INVALID_ARGUMENT for bad
  // options.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options, Handler handler,
                                                       ErrorBody error_body = {});
  // Stops accepting, closes every connection not being served, cuts those
  // being served (their writes fail, ClientGone() turns true) and waits for
  // every handler to return.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  ServerStats stats() const;

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve::http
