#include "common/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "common/base/cli.h"
#include "nlohmann/json.hpp"
#include "prometheus/gauge.h"

namespace pdserve {
namespace {

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return prometheus::MetricFamily{name, help, type, {metric}};
}

// Fields 3.. of /proc/self/stat (after "pid (comm)"), 0-based from field 3.
std::optional<std::vector<std::string>> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const size_t paren = line.rfind(')');  // comm may hold spaces and parentheses
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(paren + 1));
  std::vector<std::string> fields;
  for (std::string f; rest >> f;) fields.push_back(f);
  if (fields.size() < 22) return std::nullopt;
  return fields;
}

std::optional<double> BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double t;
      if (in >> t) return t;
      return std::nullopt;
    }
    in.ignore(1 << 20, '\n');
  }
  return std::nullopt;
}

std::optional<double> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  double n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory stream's own descriptor
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // stat fields counted from 3 (state): utime 14, stime 15, num_threads 20,
  // starttime 22, vsize 23, rss 24 -> indices 11, 12, 17, 19, 20, 21.
  if (auto f = StatFields(); f.has_value() && ticks > 0) {
    const auto& v = *f;
    out.push_back(Family("process_cpu_seconds_total", "Total user and system CPU time in seconds",
                         MetricType::Counter, (std::stod(v[11]) + std::stod(v[12])) / ticks));
    out.push_back(Family("process_threads", "Number of OS threads of the process",
                         MetricType::Gauge, std::stod(v[17])));
    out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes",
                         MetricType::Gauge, std::stod(v[20])));
    out.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes",
                         MetricType::Gauge, std::stod(v[21]) * page));
    if (auto boot = BootTimeSeconds()) {
      out.push_back(Family("process_start_time_seconds",
                           "Start time of the process since the Unix epoch in seconds",
                           MetricType::Gauge, *boot + std::stod(v[19]) / ticks));
    }
  }
  if (auto fds = OpenFds()) {
    out.push_back(
        Family("process_open_fds", "Number of open file descriptors", MetricType::Gauge, *fds));
  }
  if (rlimit limit; getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.push_back(Family("process_max_fds", "Maximum number of open file descriptors",
                         MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

std::string ModelNameOf(const std::string& model_dir) {
  std::ifstream in(model_dir + "/config.json");
  if (in) {
    const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_object() && config.contains("_name_or_path") &&
        config["_name_or_path"].is_string() &&
        !config["_name_or_path"].get<std::string>().empty()) {
      return config["_name_or_path"].get<std::string>();
    }
  }
  std::string dir = model_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

void RegisterBuildInfo(prometheus::Registry& registry, const std::string& backend,
                       const std::string& model) {
  prometheus::BuildGauge()
      .Name("pdserve_build_info")
      .Help("Always 1; labels: the pdserve version, compute backend and model")
      .Register(registry)
      .Add({{"version", ProjectVersion()}, {"backend", backend}, {"model", model}})
      .Set(1);
}

}  // namespace pdserve
