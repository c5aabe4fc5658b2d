#include "tests/integration/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace pdserve::testing {

namespace {

// The children not yet reaped, so that a test that crashes (an abort, a
// segmentation fault) or is interrupted ends them too instead of leaving
// its servers running. A slot is cleared before its pid is reaped, so a
// pid reused by another process is never signalled.
constexpr int kMaxChildren = 512;
std::array<std::atomic<pid_t>, kMaxChildren> live_children{};
constexpr std::array<int, 6> kFatalSignals = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGTERM, SIGINT};
std::array<struct sigaction, kFatalSignals.size()> previous_actions;

// Async-signal-safe: kill(2), sigaction(2) and raise(3) only.
void EndChildrenAndReraise(int sig, siginfo_t* info, void* context) {
  for (std::atomic<pid_t>& slot : live_children) {
    const pid_t pid = slot.load(std::memory_order_relaxed);
    if (pid > 0) kill(pid, SIGKILL);
  }
  for (size_t i = 0; i < kFatalSignals.size(); ++i) {
    if (kFatalSignals[i] != sig) continue;
    const struct sigaction& before = previous_actions[i];
    if ((before.sa_flags & SA_SIGINFO) && before.sa_sigaction != nullptr) {
      before.sa_sigaction(sig, info, context);  // a sanitizer's report, say
      return;
    }
    if (before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN) {
      before.sa_handler(sig);
      return;
    }
    sigaction(sig, &before, nullptr);
    raise(sig);
  }
}

void InstallCrashCleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (size_t i = 0; i < kFatalSignals.size(); ++i) {
      sigaction(kFatalSignals[i], nullptr, &previous_actions[i]);
      if (previous_actions[i].sa_handler == SIG_IGN) continue;  // (nohup: SIGINT stays ignored)
      struct sigaction action {};
      action.sa_sigaction = EndChildrenAndReraise;
      action.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
      sigemptyset(&action.sa_mask);
      sigaction(kFatalSignals[i], &action, &previous_actions[i]);
    }
  });
}

void RegisterChild(pid_t pid) {
  InstallCrashCleanup();
  for (std::atomic<pid_t>& slot : live_children) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return;
  }
}

void UnregisterChild(pid_t pid) {
  for (std::atomic<pid_t>& slot : live_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

// If `pid` has exited: forgets it, then reaps it (its status in `status`).
// Checked without reaping first, so the pid stays this process's zombie
// until no handler can signal it.
bool ReapIfExited(pid_t pid, int* status) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid) {
    return false;
  }
  UnregisterChild(pid);
  waitpid(pid, status, 0);
  return true;
}

}  // namespace

Subprocess::~Subprocess() { Stop(absl::Seconds(5)); }

absl::Status Subprocess::Start(const std::vector<std::string>& argv, const std::string& log_path) {
  log_path_ = log_path;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  // Children must not inherit blocked signals from the test's threads.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int rc = posix_spawn(&pid_, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    pid_ = -1;
    return absl::InternalError(absl::StrCat("posix_spawn ", argv[0], ": ", strerror(rc)));
  }
  RegisterChild(pid_);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> Subprocess::WaitReady(const std::string& ready_path,
                                                                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (pid_ > 0 && ReapIfExited(pid_, &status)) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("process exited before ready; log:\n", ReadLog()));
    }
    std::ifstream in(ready_path);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      auto j = nlohmann::json::parse(ss.str(), nullptr, false);
      if (!j.is_discarded() && j.is_object()) return j.get<std::map<std::string, std::string>>();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("not ready within ", absl::FormatDuration(timeout),
                                                  "; log:\n", ReadLog()));
}

int Subprocess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return 0;
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  int status = 0;
  while (absl::Now() < deadline) {
    if (ReapIfExited(pid_, &status)) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid_, SIGKILL);
  UnregisterChild(pid_);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -SIGKILL;
}

void Subprocess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  UnregisterChild(pid_);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

bool Subprocess::Signal(int sig) const { return pid_ > 0 && kill(pid_, sig) == 0; }

std::string Subprocess::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  auto res = client.Get(path.c_str());
  if (!res) return absl::UnavailableError(absl::StrCat("GET :", port, path, " failed"));
  if (res->status != 200) return absl::UnavailableError(absl::StrCat("GET ", path, ": HTTP ", res->status));
  return res->body;
}

double MetricValue(const std::string& exposition, const std::string& metric) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    if (!absl::StartsWith(line, metric)) continue;
    const char next = line.size() > metric.size() ? line[metric.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &v)) sum += v;
  }
  return sum;
}

bool WaitUntilExited(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (!stat || paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] == 'Z') return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

}  // namespace pdserve::testing
