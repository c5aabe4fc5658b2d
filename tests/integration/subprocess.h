// Test helper: starts a real pdserve process, waits for its ready file, and
// stops it (SIGTERM, then SIGKILL) by its own pid. Output goes to a log file
// that is printed when a test fails to start a process.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::testing {

class Subprocess {
 public:
  Subprocess() = default;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();  // Stop()s

  // Starts `argv` with stdout and stderr to `log_path`.
  absl::Status Start(const std::vector<std::string>& argv, const std::string& log_path);
  // Waits until `ready_path` holds the ready JSON; fails early if the process exits.
  absl::StatusOr<std::map<std::string, std::string>> WaitReady(const std::string& ready_path,
                                                               absl::Duration timeout);
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit status (or -signal).
  int Stop(absl::Duration grace = absl::Seconds(10));
  void Kill();  // SIGKILL now (kill -9), and reaps the process
  // Sends `sig` (SIGSTOP, SIGCONT, ...) to the process; false if it is not running.
  bool Signal(int sig) const;
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  std::string ReadLog() const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

// True once `pid` (a child of this process) has exited: it is a zombie until
// reaped. Polled, so the caller can then reap it with Subprocess::Stop without
// a second SIGTERM (threads that a process's libraries start before main do
// not block SIGTERM, so a second one kills a draining process).
bool WaitUntilExited(pid_t pid, absl::Duration timeout);

// GET http://127.0.0.1:port/path; error if the server does not answer 200.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);
// Sum of all samples of `metric` (exact name, any labels) in text exposition.
double MetricValue(const std::string& exposition, const std::string& metric);

}  // namespace pdserve::testing
