// Serves a prometheus-cpp registry, plus the process metrics
// (common/process_metrics.h), as text exposition on GET /metrics (and
// GET /healthz; GET /livez and /readyz answer 200 or 503 from the process's
// gRPC health, ProcessLive / ProcessReady) with common/http_server.h.
// prometheus-cpp's own Exposer (civetweb) is not used: it cannot bind port 0
// and its fixed-stack threads fail in processes that link cuBLAS (see
// docs/decisions/operations.md).
//
// Every connection serves one request and is closed ("Connection: close");
// Prometheus opens one connection per scrape. A request must arrive within
// 2 s of its connection; at most 64 connections are open (the oldest
// waiting one makes room for a new one), and 4 threads answer, so clients
// that send their requests slowly (or not at all) cannot keep a scrape or a
// probe out.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/process_metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::http {
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

  int port() const;

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ProcessCollector> process_;
  std::unique_ptr<http::Server> server_;  // last: its handlers use the above
};

// Histogram buckets, in seconds. Prometheus estimates a quantile by linear
// interpolation inside the bucket that holds it, so its error is up to the
// bucket's width: the two client-facing histograms have bounds about 7%
// apart where their values usually fall and at the SLO and alert
// thresholds, coarser only at the extremes (docs/performance.md compares
// their quantiles with client-measured percentiles).
//
// Time to first token: 1 ms to 120 s; ~7% steps from 0.1 s to 5 s (the TTFT
// alert and SLO at 2 s), ~20% from 10 ms to 0.1 s, at most 12.5% from 5 s
// to 10 s.
const std::vector<double>& TimeToFirstTokenBuckets();
// Inter-token latency: 1 ms to 60 s (a stall of many seconds reads as what
// it is); ~10% steps from 3 ms to 1 s, ~7% from 0.1 s to 0.3 s (the ITL
// alert and SLO at 200 ms), about 12% from 1 s to 10 s.
const std::vector<double>& InterTokenLatencyBuckets();
// Other request-scale durations (E2E, queue time, prefill step, KV
// transfer): 1 ms to 600 s.
const std::vector<double>& LatencyBuckets();
// Per-step durations (decode step): 0.1 ms to 30 s.
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
