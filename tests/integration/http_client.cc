#include "tests/integration/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pdserve::testing {

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

HttpResult Curl(int port, const std::string& path, const std::string& body,
                const std::string& scratch, const std::string& extra) {
  std::string command = absl::StrCat("curl -sS -N --max-time 60 -w '\\n%{http_code}' ", extra,
                                     " 'http://127.0.0.1:", port, path, "'");
  if (!body.empty()) {
    std::ofstream(scratch, std::ios::binary) << body;
    absl::StrAppend(&command, " -H 'Content-Type: application/json' --data-binary @'", scratch,
                    "'");
  }
  CommandResult run = RunCommand(command);
  HttpResult result;
  result.curl_exit = run.exit_code;
  const size_t last = run.output.rfind('\n');
  if (last == std::string::npos) return result;
  if (!absl::SimpleAtoi(run.output.substr(last + 1), &result.status)) result.status = 0;
  result.body = run.output.substr(0, last);
  return result;
}

std::vector<std::string> SseData(const std::string& stream) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(stream, '\n')) {
    if (absl::ConsumePrefix(&line, "data: ")) out.emplace_back(line);
  }
  return out;
}

absl::Status PostAndHangUp(int port, const std::string& path, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{.tv_sec = 30, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError("connect");
  }
  const std::string request = absl::StrCat(
      "POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
      "Content-Length: ", body.size(), "\r\n\r\n", body);
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send");
  }
  std::string response;
  char buffer[1024];
  while (response.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError("the server closed the connection before its headers");
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (!absl::StartsWith(response, "HTTP/1.1 200")) {
    return absl::FailedPreconditionError(
        absl::StrCat("not a 200 response: ", response.substr(0, 40)));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::testing
