#include "common/metrics_server.h"

#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace pdserve {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    std::shared_ptr<prometheus::Registry> registry, const std::string& host, int port) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->registry_ = std::move(registry);
  s->server_ = std::make_unique<httplib::Server>();
  prometheus::Registry* reg = s->registry_.get();
  s->server_->Get("/metrics", [reg](const httplib::Request&, httplib::Response& res) {
    prometheus::TextSerializer serializer;
    res.set_content(serializer.Serialize(reg->Collect()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  s->server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  // SO_REUSEADDR only (the library default adds SO_REUSEPORT, which would let
  // two servers share a port).
  s->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  if (port == 0) {
    s->port_ = s->server_->bind_to_any_port(host);
  } else {
    s->port_ = s->server_->bind_to_port(host, port) ? port : -1;
  }
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics server cannot bind ", host, ":", port));
  }
  httplib::Server* server = s->server_.get();
  s->thread_ = std::thread([server] { server->listen_after_bind(); });
  // stop() before the accept loop runs would be lost and the loop would never
  // end: return only once it runs.
  for (int i = 0; i < 5000 && !server->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server->is_running()) return absl::InternalError("metrics server did not start");
  return s;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                               0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
  return kBuckets;
}

const std::vector<double>& TokenLatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                               0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5};
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
