// Serves a prometheus-cpp registry as text exposition on GET /metrics (and
// GET /healthz) with cpp-httplib. prometheus-cpp's own Exposer (civetweb) is
// not used: it cannot bind port 0 and its fixed-stack threads fail in
// processes that link cuBLAS (see docs/architecture.md).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}

namespace pdserve {

class MetricsServer {
 public:
  // Binds host:port (0 picks a free port) and starts serving. `registry`
  // must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      std::shared_ptr<prometheus::Registry> registry, const std::string& host, int port);
  ~MetricsServer();  // stops and joins

  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;  // runs server_->listen_after_bind()
};

// Default histogram buckets, in seconds, for request latencies (TTFT, E2E).
const std::vector<double>& LatencyBuckets();
// Finer buckets for per-token and per-step latencies (ITL, step seconds).
const std::vector<double>& TokenLatencyBuckets();

// An unlabeled metric registered in `r` (a family of one series); the
// reference lives as long as the registry.
prometheus::Gauge& MakeGauge(prometheus::Registry& r, const char* name, const char* help);
prometheus::Counter& MakeCounter(prometheus::Registry& r, const char* name, const char* help);
prometheus::Histogram& MakeHistogram(prometheus::Registry& r, const char* name, const char* help,
                                     const std::vector<double>& buckets);

// pdserve_scheduler_step_seconds: time to plan one step and take its blocks
// (every worker role), 1 us to 100 ms.
prometheus::Histogram& MakeSchedulerStepHistogram(prometheus::Registry& r);

}  // namespace pdserve
