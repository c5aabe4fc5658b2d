// The process skeleton; see service_process.h.
#include "common/service/service_process.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/base/cli.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "common/service/auth_flags.h"
#include "common/process_metrics.h"
#include "common/ready_file.h"

namespace pdserve {

void StartProcess(int argc, char** argv, const char* usage, const char* main_file) {
  BlockShutdownSignals();
  ParseFlags(argc, argv, usage, main_file);
}

ServiceProcess::ServiceProcess(ServiceOptions options)
    : options_(std::move(options)), registry_(std::make_shared<prometheus::Registry>()) {}

ServiceProcess::~ServiceProcess() = default;

int ServiceProcess::Begin() {
  if (!SetLogLevelFlag(options_.log_level)) return 2;
  if (options_.cluster_auth) {
    if (absl::Status s = InitClusterAuthFromFlags(options_.host); !s.ok()) {
      PDSERVE_LOG(ERROR) << s;
      return 2;
    }
  }
  return 0;
}

absl::Status ServiceProcess::StartMetrics(const std::string& backend,
                                          const std::string& model_dir) {
  RegisterBuildInfo(*registry_, backend, ModelNameOf(model_dir));
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(registry_, options_.host, options_.metrics_port);
  if (!server.ok()) return server.status();
  metrics_server_ = *std::move(server);
  return absl::OkStatus();
}

int ServiceProcess::metrics_port() const {
  return metrics_server_ != nullptr ? metrics_server_->port() : -1;
}

absl::StatusOr<int> ServiceProcess::AddGrpcServer(
    int port, const std::vector<grpc::Service*>& services,
    std::shared_ptr<grpc::ServerCredentials> credentials, int max_receive_message_bytes) {
  absl::StatusOr<GrpcServerHandle> server = StartGrpcServer(
      options_.host, port, services, std::move(credentials), max_receive_message_bytes);
  if (!server.ok()) return server.status();
  if (servers_.empty()) address_ = JoinHostPort(options_.host, server->port);
  servers_.push_back(*std::move(server));
  return servers_.back().port;
}

void ServiceProcess::RegisterWithRouter(const std::string& router, internal::v1::WorkerInfo info,
                                        WorkerRegistrar::LoadFn load,
                                        std::function<bool()> draining) {
  if (router.empty()) return;
  // Not serving until the router has accepted us (wrong token, router down).
  SetReady(server(), false);
  auto on_registered = [draining = std::move(draining), server = &server()](bool registered) {
    if (!draining()) SetReady(*server, registered);
  };
  info.set_address(address_);
  info.set_metrics_address(JoinHostPort(options_.host, metrics_port()));
  registrar_ =
      std::make_unique<WorkerRegistrar>(router, std::move(info), std::move(load), on_registered);
}

void ServiceProcess::AnnounceReady(std::map<std::string, std::string> extra,
                                   const std::string& what) {
  ::pdserve::AnnounceReady(options_.ready_file, address_, metrics_port(), std::move(extra));
  PDSERVE_LOG(INFO) << "pdserve " << VersionString() << " " << options_.name << " " << what;
}

int ServiceProcess::ServeUntilSignal(const DrainSteps& steps) {
  const int sig = WaitForShutdownSignal();
  PDSERVE_LOG(INFO) << "signal " << sig << ": draining";
  if (steps.refuse) steps.refuse();
  if (!servers_.empty()) SetServing(server(), false);
  if (registrar_) registrar_->Poke();
  if (steps.idle) WaitUntilIdle(options_.drain_timeout, steps.idle);
  registrar_.reset();
  if (steps.close) steps.close();
  // Cancels calls still open after the deadline and waits for their
  // handlers, which release what they hold of the engine before it goes.
  for (GrpcServerHandle& s : servers_) {
    s.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  }
  servers_.clear();  // before the services and the engine they call go
  if (steps.after) steps.after();
  PDSERVE_LOG(INFO) << options_.name << " stopped";
  return 0;
}

}  // namespace pdserve
