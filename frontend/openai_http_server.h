// The OpenAI-compatible HTTP adapter over a SessionManager, served with
// common/http_server.h: POST /v1/completions and /v1/chat/completions (with "stream":
// true as server-sent events ending in "data: [DONE]"), GET /v1/models and
// GET /health (503 while draining). Request and response formats are in
// frontend/openai_protocol.h; errors are OpenAI's JSON error objects with
// the matching HTTP status.
//
// Until a request's first output the response is not committed, so a
// refusal or a failure before the first token gets its HTTP status. After
// it, a stream reports a failure as an error event, and a non-streamed
// response (sent once complete, chunked) is cut off. A client that closes
// its connection cancels its request: the worker calls are cancelled and
// their KV freed (noticed at the next write, or within `poll` while no
// token is due). A waiting request's thread sleeps until a token, the end,
// its deadline or `poll`: HTTP offers no event for a client that left, so
// `poll` is a long one.
//
// Connections: the server's event thread reads each request (its head within
// `header_timeout`, its body within `body_timeout`) before a handler thread
// takes it, so slow or idle clients hold no thread; at most
// `max_connections` are open, the one waiting longest for its request (or
// idle longest) closed to make room. Handler threads: one per request being
// served, created on demand, at most `max_threads` (further requests wait).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "frontend/request_session.h"
#include "frontend/tool_calls.h"

namespace pdserve::http {
class Server;
struct Request;
class ResponseWriter;
}  // namespace pdserve::http

namespace pdserve::frontend {
namespace openai {
struct ParsedRequest;
}  // namespace openai

struct OpenAiHttpOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  // The `model` clients name (GET /v1/models lists it).
  std::string model_name;
  int max_threads = 1024;
  // Open connections (see above); also at most half of RLIMIT_NOFILE.
  int max_connections = 2048;
  // A request's head must arrive within header_timeout (of its first byte,
  // or of the accept), its body within body_timeout of the head; a
  // kept-alive connection may wait idle_timeout for its next request.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(60);
  absl::Duration idle_timeout = absl::Seconds(30);
  // Largest request body; larger ones get 413.
  int64_t max_body_bytes = int64_t{64} << 20;
  // How often a waiting request checks that its client is still there.
  absl::Duration poll = absl::Seconds(1);
  // The model's tool-call format: "auto" (from the chat template), "hermes",
  // "llama3_json" or "none" (frontend/tool_calls.h).
  std::string tool_call_parser = "auto";
  // Most choices (`n`) per request; each choice is a sequence of its own
  // (frontend/choice_fanout.h), admitted as one of --max_in_flight.
  int max_n = 16;
};

class OpenAiHttpServer {
 public:
  // Binds and starts serving. `sessions` must outlive the server.
  static absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> Start(OpenAiHttpOptions options,
                                                                 SessionManager* sessions);
  // Stops accepting, ends requests still running as if their clients left,
  // and joins every thread.
  ~OpenAiHttpServer();

  int port() const;

 private:
  OpenAiHttpServer(OpenAiHttpOptions options, SessionManager* sessions, ToolCallFormat tool_format);
  void Handle(const http::Request& req, http::ResponseWriter& out);
  void Generate(bool chat, const http::Request& req, http::ResponseWriter& out);
  // A request for n > 1 choices (ChoiceFanout).
  void GenerateChoices(const openai::ParsedRequest& parsed, const CallInfo& call,
                       http::ResponseWriter& out);
  bool stopping() const { return stopping_.load(); }

  const OpenAiHttpOptions options_;
  SessionManager* const sessions_;
  const ToolCallFormat tool_format_;
  const int64_t created_;  // unix seconds, the models list's `created`
  std::atomic<bool> stopping_{false};
  std::unique_ptr<http::Server> server_;  // last: its handlers use the above
};

// What a main starts from its flags: no server when `port` < 0; the model
// name is `model_name`, else ModelNameOf(model_dir) (common/process_metrics.h:
// config.json's _name_or_path, else the directory's last component); threads
// and connections follow the admission limit (max_in_flight + 64 threads,
// max_in_flight + 1024 connections); `max_n` caps the choices per request.
absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> StartOpenAiHttpFromFlags(
    const std::string& host, int port, const std::string& model_name, const std::string& model_dir,
    int max_in_flight, SessionManager* sessions, const std::string& tool_call_parser = "auto",
    int max_n = 16);

}  // namespace pdserve::frontend
