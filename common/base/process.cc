#include "common/base/process.h"

#include <signal.h>
#include <unistd.h>

#include <iostream>

#include "absl/time/clock.h"
#include "common/base/logging.h"

namespace pdserve {
namespace {
sigset_t ShutdownSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void BlockShutdownSignals() {
  sigset_t set = ShutdownSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForShutdownSignal() {
  sigset_t set = ShutdownSet();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

bool SetLogLevelFlag(const std::string& name) {
  LogLevel level;
  if (!ParseLogLevel(name, &level)) {
    std::cerr << "--log_level: unknown level \"" << name << "\" (debug, info, warning or error)\n";
    return false;
  }
  SetMinLogLevel(level);
  return true;
}

bool WaitUntilIdle(absl::Duration timeout, const std::function<bool()>& idle) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!idle()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace pdserve
