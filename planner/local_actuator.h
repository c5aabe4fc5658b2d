// Scales a local cluster (deploy/local/cluster.sh) by running the script:
// `cluster.sh add-prefill|add-decode WORK` (waits until the worker is
// registered) to grow a pool, and `cluster.sh drain WORK PID` to shrink one.
// A drain runs in the background (the worker stops taking requests at once
// and finishes those it holds, up to its --drain_timeout_ms) and the worker
// no longer counts from the moment it is asked to drain. The least loaded
// worker of the pool is drained (its own /metrics: queued prompt tokens,
// decode sequences held), the newest on a tie.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/actuator.h"
#include "planner/scrape_source.h"

namespace pdserve::planner {

struct LocalOptions {
  std::string cluster_sh;  // path of deploy/local/cluster.sh
  std::string work_dir;    // the cluster's WORK
};

class LocalActuator final : public Actuator {
 public:
  static absl::StatusOr<std::unique_ptr<LocalActuator>> Create(LocalOptions options, Fetch fetch);
  ~LocalActuator() override;  // waits (bounded) for drains still running

  absl::StatusOr<PerPool<int>> Current() override;
  absl::Status Scale(Pool pool, int replicas) override;
  std::string Describe() const override;

 private:
  struct Worker {
    int index = 0;  // N of prefillN / decodeN
    pid_t pid = 0;
    int metrics_port = 0;
  };
  LocalActuator(LocalOptions options, Fetch fetch)
      : options_(std::move(options)), fetch_(std::move(fetch)) {}
  // Live workers of `pool` not being drained, oldest first.
  std::vector<Worker> Serving(Pool pool);
  void ReapDrains();
  double Load(Pool pool, const Worker& w);

  LocalOptions options_;
  Fetch fetch_;
  std::map<pid_t, pid_t> draining_;  // worker pid -> pid of its `cluster.sh drain`
};

// Runs `argv` with stdout and stderr appended to `log_path` and an empty
// signal mask; returns its pid.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log_path);

}  // namespace pdserve::planner
