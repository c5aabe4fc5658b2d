// Metrics every pdserve process exports besides its own: the standard
// Prometheus process metrics and pdserve_build_info.
#pragma once

#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace pdserve {

// The process metrics of the Prometheus client libraries, read from
// /proc/self at each collection (prometheus-cpp has no process collector):
//   process_cpu_seconds_total        user + system CPU time
//   process_resident_memory_bytes    RSS
//   process_virtual_memory_bytes     address space
//   process_open_fds, process_max_fds
//   process_threads                  threads of the process
//   process_start_time_seconds       since the Unix epoch
// A value that cannot be read is left out of that collection. Thread-safe.
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// A model's name for labels: config.json's "_name_or_path" when set, else
// the directory's last component ("" for an empty path).
std::string ModelNameOf(const std::string& model_dir);

// Registers pdserve_build_info{version, backend, model} = 1 in `registry`:
// version from common/base/cli.h, `backend` the compute backend ("cpu", "cuda";
// "none" for processes without one), `model` from ModelNameOf.
void RegisterBuildInfo(prometheus::Registry& registry, const std::string& backend,
                       const std::string& model);

}  // namespace pdserve
