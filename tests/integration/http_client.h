// Test helpers for the OpenAI-compatible HTTP API: requests through the real
// curl binary, the data lines of a server-sent-event stream, and a raw
// connection that goes away in the middle of a response.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pdserve::testing {

struct CommandResult {
  int exit_code = -1;  // -1: the command could not run or was killed
  std::string output;  // stdout
};
// Runs `command` with /bin/sh and collects its stdout.
CommandResult RunCommand(const std::string& command);

struct HttpResult {
  int status = 0;  // 0: curl failed (see curl_exit)
  std::string body;
  int curl_exit = 0;
};
// curl -sS -N against http://127.0.0.1:port`path`; a POST of `body` (JSON)
// when `body` is not empty, else a GET. `scratch` is a file the body is
// written to. `extra` goes on curl's command line as is.
HttpResult Curl(int port, const std::string& path, const std::string& body,
                const std::string& scratch, const std::string& extra = "");

// The payloads of the "data: ..." lines of an event stream, in order.
std::vector<std::string> SseData(const std::string& stream);

// POSTs `body` to `path` on a plain socket, reads until the response's
// headers have arrived (a non-streamed response commits them with its first
// token), then closes the connection.
absl::Status PostAndHangUp(int port, const std::string& path, const std::string& body);

}  // namespace pdserve::testing
