#include "common/metrics_server.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/http_server.h"
#include "prometheus/text_serializer.h"

namespace pdserve {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    std::shared_ptr<prometheus::Registry> registry, const std::string& host, int port) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->registry_ = std::move(registry);
  s->process_ = std::make_unique<ProcessCollector>();
  prometheus::Registry* reg = s->registry_.get();
  const ProcessCollector* process = s->process_.get();
  auto handler = [reg, process](const http::Request& req, http::ResponseWriter& out) {
    const std::string& path = req.head.path;
    if (req.head.method != "GET") {
      out.Send(404, "text/plain", "not found\n");
    } else if (path == "/metrics") {
      std::vector<prometheus::MetricFamily> families = reg->Collect();
      for (prometheus::MetricFamily& f : process->Collect()) families.push_back(std::move(f));
      prometheus::TextSerializer serializer;
      out.Send(200, "text/plain; version=0.0.4; charset=utf-8", serializer.Serialize(families));
    } else if (path == "/healthz") {
      out.Send(200, "text/plain", "ok\n");
    } else if (path == "/livez" || path == "/readyz") {
      // The gRPC health states for HTTP probes (where the gRPC port runs
      // mutual TLS, which the kubelet's gRPC probes cannot speak).
      const bool up = path == "/livez" ? ProcessLive() : ProcessReady();
      out.Send(up ? 200 : 503, "text/plain", up ? "ok\n" : "not serving\n");
    } else {
      out.Send(404, "text/plain", "not found\n");
    }
  };
  absl::StatusOr<std::unique_ptr<http::Server>> server =
      http::Server::Start({.host = host,
                           .port = port,
                           .name = "metrics server",
                           .max_connections = 64,
                           .max_handler_threads = 4,
                           .header_timeout = absl::Seconds(2),
                           .body_timeout = absl::Seconds(2),
                           .idle_timeout = absl::Seconds(2),
                           .write_timeout = absl::Seconds(10),
                           .max_header_bytes = 16 * 1024,
                           .max_body_bytes = 64 * 1024,
                           .max_requests_per_connection = 1},
                          handler);
  if (!server.ok()) {
    return absl::UnavailableError(absl::StrCat("metrics server cannot bind ", host, ":", port, ": ",
                                               server.status().message()));
  }
  s->server_ = *std::move(server);
  return s;
}

MetricsServer::~MetricsServer() { server_.reset(); }

int MetricsServer::port() const { return server_->port(); }

// Bucket bounds are round numbers. Where a histogram's values usually fall
// they are about 7% apart (at most 7.5%): a quantile read from them is within
// that of the true value even when only one observation lies in the bucket,
// as at the p99 of a few dozen requests. The SLO thresholds and alert
// thresholds (0.2 s, 0.25 s, 2 s, 2.5 s) are bounds.
const std::vector<double>& TimeToFirstTokenBuckets() {
  // clang-format off
  static const std::vector<double> kBuckets = {
      0.001, 0.0025, 0.005, 0.0075, 0.01,                                    // 1-10 ms
      0.012, 0.015, 0.018, 0.022, 0.027, 0.033, 0.039, 0.047, 0.056, 0.068,  // ~20% apart
      0.082,
      0.1,  0.107, 0.115, 0.123, 0.132, 0.141, 0.15, 0.16, 0.17, 0.18,       // ~7% apart
      0.19, 0.2,   0.215, 0.23,  0.24,  0.25,  0.265, 0.28, 0.3,  0.32,
      0.34, 0.36,  0.38,  0.4,   0.43,  0.46,  0.48,  0.5,  0.53, 0.56,
      0.6,  0.64,  0.68,  0.72,  0.76,  0.8,   0.85,  0.9,  0.95,
      1.0,  1.07,  1.15,  1.23,  1.32,  1.41,  1.5,   1.6,  1.7,  1.8,
      1.9,  2.0,   2.15,  2.3,   2.4,   2.5,   2.65,  2.8,  3.0,  3.2,
      3.4,  3.6,   3.8,   4.0,   4.3,   4.6,   4.8,   5.0,
      5.5,  6.0,   6.5,   7.0,   7.5,   8.0,   9.0,   10.0,                 // <= 12.5% apart
      11.0, 12.5,  15.0,  17.5,  20.0,  25.0,  30.0,  45.0, 60.0, 90.0,      // to 2 min
      120.0};
  // clang-format on
  return kBuckets;
}

const std::vector<double>& InterTokenLatencyBuckets() {
  // clang-format off
  static const std::vector<double> kBuckets = {
      0.001,  0.0015, 0.002,  0.0025,                                        // 1-3 ms
      0.003,  0.0033, 0.0036, 0.0039, 0.0043, 0.0047, 0.0051, 0.0056,        // ~10% apart
      0.0062, 0.0068, 0.0075, 0.0082, 0.0091, 0.01,   0.011,  0.012,
      0.013,  0.014,  0.015,  0.016,  0.018,  0.02,   0.022,  0.024,  0.027,
      0.03,   0.033,  0.036,  0.039,  0.043,  0.047,  0.051,  0.056,
      0.062,  0.068,  0.075,  0.082,  0.091,
      0.1,    0.107,  0.115,  0.123,  0.132,  0.141,  0.15,   0.16,          // ~7% apart
      0.17,   0.18,   0.19,   0.2,    0.215,  0.23,   0.24,   0.25,
      0.265,  0.28,   0.3,
      0.33,   0.36,   0.39,   0.43,   0.47,   0.51,   0.56,   0.62,          // ~10% apart
      0.68,   0.75,   0.82,   0.91,   1.0,
      1.12,   1.25,   1.4,    1.6,    1.8,    2.0,    2.25,   2.5,           // stalls: ~12%
      2.8,    3.2,    3.6,    4.0,    4.5,    5.0,    5.6,    6.3,
      7.1,    8.0,    9.0,    10.0,
      12.5,   15.0,   20.0,   30.0,   45.0,   60.0};                         // to 1 min
  // clang-format on
  return kBuckets;
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.001, 0.0025, 0.005, 0.01,  0.025, 0.05,
                                               0.1,   0.25,   0.5,   1.0,   2.5,   5.0,
                                               10.0,  30.0,   60.0,  120.0, 300.0, 600.0};
  return kBuckets;
}

const std::vector<double>& TokenLatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                               1.0,    2.5,     5.0,    10.0,  30.0};
  return kBuckets;
}

prometheus::Gauge& MakeGauge(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

prometheus::Counter& MakeCounter(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram& MakeHistogram(prometheus::Registry& r, const char* name, const char* help,
                                     const std::vector<double>& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

prometheus::Histogram& MakeSchedulerStepHistogram(prometheus::Registry& r) {
  return MakeHistogram(r, "pdserve_scheduler_step_seconds",
                       "Time to plan one scheduler step and take its KV blocks",
                       {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                        5e-3, 0.01, 0.025, 0.05, 0.1});
}

}  // namespace pdserve
