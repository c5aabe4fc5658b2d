#include "common/process.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"

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

absl::Status WriteReadyFile(const std::string& path,
                            const std::map<std::string, std::string>& fields) {
  nlohmann::json j(fields);
  std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    out << j.dump() << "\n";
    if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

void AnnounceReady(const std::string& path, const std::string& grpc_address, int metrics_port,
                   std::map<std::string, std::string> extra) {
  if (path.empty()) return;
  extra["grpc_address"] = grpc_address;
  extra["metrics_port"] = absl::StrCat(metrics_port);
  extra["pid"] = absl::StrCat(getpid());
  if (absl::Status s = WriteReadyFile(path, extra); !s.ok()) PDSERVE_LOG(ERROR) << s;
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
