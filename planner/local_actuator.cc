#include "planner/local_actuator.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/prometheus_text.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace pdserve::planner {
namespace {

std::string RoleOf(Pool pool) { return std::string(PoolName(pool)); }

std::string LastLines(const std::string& path, size_t max_chars) {
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > max_chars ? all.substr(all.size() - max_chars) : all;
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  // The planner blocks SIGTERM for its own shutdown; the script and the
  // workers it starts must not inherit that mask.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", strerror(rc)));
  }
  return pid;
}

absl::StatusOr<std::unique_ptr<LocalActuator>> LocalActuator::Create(LocalOptions options,
                                                                     Fetch fetch) {
  if (access(options.cluster_sh.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_sh ", options.cluster_sh, " is not an executable script"));
  }
  if (!std::filesystem::exists(std::filesystem::path(options.work_dir) / "cluster.env")) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.work_dir, " is not a cluster.sh work directory (no cluster.env)"));
  }
  return std::unique_ptr<LocalActuator>(new LocalActuator(std::move(options), std::move(fetch)));
}

LocalActuator::~LocalActuator() {
  // A drain ends within the worker's --drain_timeout_ms; cluster.sh gives up after 40 s.
  const absl::Time give_up = absl::Now() + absl::Seconds(45);
  while (!draining_.empty() && absl::Now() < give_up) {
    ReapDrains();
    if (!draining_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string LocalActuator::Describe() const {
  return absl::StrCat("local cluster ", options_.work_dir, " via ", options_.cluster_sh);
}

void LocalActuator::ReapDrains() {
  for (auto it = draining_.begin(); it != draining_.end();) {
    int status = 0;
    const pid_t done = waitpid(it->second, &status, WNOHANG);
    if (done == it->second || done < 0) {
      if (done == it->second && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        PDSERVE_LOG(WARNING) << "planner: cluster.sh drain of pid " << it->first << " failed; see "
                             << options_.work_dir << "/planner-actuator.log";
      }
      it = draining_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<LocalActuator::Worker> LocalActuator::Serving(Pool pool) {
  std::vector<Worker> out;
  const std::string role = RoleOf(pool);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.work_dir, ec)) {
    const std::string stem = entry.path().stem().string();
    if (entry.path().extension() != ".ready" || stem.rfind(role, 0) != 0) continue;
    int index = 0;
    if (!absl::SimpleAtoi(stem.substr(role.size()), &index)) continue;
    std::ifstream in(entry.path());
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    int pid = 0, port = 0;
    if (!j.is_object() || !j.value("pid", nlohmann::json()).is_string() ||
        !absl::SimpleAtoi(j["pid"].get<std::string>(), &pid) ||
        !absl::SimpleAtoi(j.value("metrics_port", std::string("0")), &port)) {
      continue;
    }
    if (kill(pid, 0) != 0 || draining_.count(pid)) continue;
    out.push_back({index, pid, port});
  }
  std::sort(out.begin(), out.end(),
            [](const Worker& a, const Worker& b) { return a.index < b.index; });
  return out;
}

absl::StatusOr<PerPool<int>> LocalActuator::Current() {
  ReapDrains();
  PerPool<int> out;
  for (Pool pool : kPools) out[pool] = static_cast<int>(Serving(pool).size());
  return out;
}

double LocalActuator::Load(Pool pool, const Worker& w) {
  absl::StatusOr<std::string> text = fetch_(absl::StrCat("127.0.0.1:", w.metrics_port));
  if (!text.ok()) return 0;  // not answering: nothing to lose by draining it
  const std::vector<MetricSample> samples = ParseExposition(*text);
  if (pool == Pool::kPrefill) return SumOf(samples, "pdserve_prefill_queued_tokens");
  return SumOf(samples, "pdserve_decode_running_sequences") +
         SumOf(samples, "pdserve_decode_waiting_kv_sequences");
}

absl::Status LocalActuator::Scale(Pool pool, int replicas) {
  ReapDrains();
  std::vector<Worker> serving = Serving(pool);
  const std::string role = RoleOf(pool);
  const std::string log = absl::StrCat(options_.work_dir, "/planner-actuator.log");
  for (int n = static_cast<int>(serving.size()); n < replicas; ++n) {
    absl::StatusOr<pid_t> pid = Spawn({options_.cluster_sh, "add-" + role, options_.work_dir}, log);
    if (!pid.ok()) return pid.status();
    int status = 0;
    while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(
          absl::StrCat("cluster.sh add-", role, " failed: ", LastLines(log, 600)));
    }
  }
  if (static_cast<int>(serving.size()) > replicas) {
    // Least loaded first; the newest among equals.
    std::vector<std::pair<double, Worker>> ranked;
    for (const Worker& w : serving) ranked.emplace_back(Load(pool, w), w);
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second.index > b.second.index;
    });
    for (int i = 0; i < static_cast<int>(serving.size()) - replicas; ++i) {
      const Worker& w = ranked[i].second;
      absl::StatusOr<pid_t> drain =
          Spawn({options_.cluster_sh, "drain", options_.work_dir, absl::StrCat(w.pid)}, log);
      if (!drain.ok()) return drain.status();
      draining_[w.pid] = *drain;
      PDSERVE_LOG(INFO) << "planner: draining " << role << w.index << " (pid " << w.pid << ", load "
                        << ranked[i].first << ")";
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve::planner
