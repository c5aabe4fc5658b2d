// One process skeleton for the services (router, prefill worker, decode
// worker, colocated server): log level, cluster authentication, the metrics
// server with the build info, gRPC servers with health, worker registration
// with the router, the ready file, shutdown signals and the drain. A main
// says only what is its own: its flags, its engine or orchestration, its
// services, what "idle" means for its drain.
//
//   int main(int argc, char** argv) {
//     pdserve::StartProcess(argc, argv, "what it is", __FILE__);
//     pdserve::ServiceProcess process({.name = "decode worker", ...});
//     if (int code = process.Begin(); code != 0) return code;
//     ... load, StartMetrics, AddGrpcServer, RegisterWithRouter, AnnounceReady ...
//     return process.ServeUntilSignal({.refuse = ..., .idle = ..., .after = ...});
//   }
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "common/metrics_server.h"
#include "common/worker_registrar.h"
#include "prometheus/registry.h"

namespace pdserve {

// First thing in main, before any thread exists: blocks SIGINT and SIGTERM
// (ServeUntilSignal waits for them) and parses the flags (exits on --help,
// --version and bad flags).
void StartProcess(int argc, char** argv, const char* usage, const char* main_file);

struct ServiceOptions {
  std::string name;  // in logs: "prefill worker"
  std::string host;  // every server binds here
  int metrics_port = 0;
  std::string ready_file;  // empty: none
  std::string log_level = "info";
  // Cluster authentication from its flags (InitClusterAuthFromFlags,
  // common/auth.h): every process with internal ports or channels.
  bool cluster_auth = true;
  absl::Duration drain_timeout = absl::Seconds(30);
};

// How a service drains on SIGINT/SIGTERM (every step optional).
struct DrainSteps {
  std::function<void()> refuse;  // new work is refused from now on
  std::function<bool()> idle;    // nothing is left to finish
  std::function<void()> close;   // before the gRPC servers shut down (e.g. HTTP)
  std::function<void()> after;   // after they did (e.g. the engine goes)
};

class ServiceProcess {
 public:
  explicit ServiceProcess(ServiceOptions options);
  ~ServiceProcess();

  // The log level, then cluster authentication. 0, or the exit code (2) with
  // the reason logged.
  int Begin();

  // The registry every metric of the process registers in.
  prometheus::Registry& registry() { return *registry_; }
  // Registers the build info (backend, model of `model_dir`; "none" for a
  // process without a backend) and starts the metrics server.
  absl::Status StartMetrics(const std::string& backend, const std::string& model_dir);
  int metrics_port() const;

  // Starts a gRPC server on the process's host (StartGrpcServer). The first
  // one is the process's address and its health follows registration and
  // the drain; all of them shut down at the end of the drain.
  absl::StatusOr<int> AddGrpcServer(int port, const std::vector<grpc::Service*>& services,
                                    std::shared_ptr<grpc::ServerCredentials> credentials,
                                    int max_receive_message_bytes = kMaxGrpcMessageBytes);
  const std::string& address() const { return address_; }
  grpc::Server& server() { return *servers_.front().server; }

  // With a non-empty `router`: registers `info` (address and metrics
  // address filled in here) with heartbeats carrying `load`; the first
  // server reports not ready until the router accepted the worker (wrong
  // token, router down), and while `draining`.
  void RegisterWithRouter(const std::string& router, internal::v1::WorkerInfo info,
                          WorkerRegistrar::LoadFn load, std::function<bool()> draining);

  // Writes the ready file (the address, the metrics port and `extra`) and
  // logs "pdserve VERSION <name> <what>".
  void AnnounceReady(std::map<std::string, std::string> extra, const std::string& what);

  // Waits for SIGINT or SIGTERM, then drains: `refuse`; the first server
  // stops reporting SERVING and the router is told; up to drain_timeout for
  // `idle`; the registration ends; `close`; every gRPC server shuts down
  // (calls still open after 2 s are cancelled and their handlers waited
  // for) and is destroyed; `after`. Logs each stage; returns the exit code (0).
  int ServeUntilSignal(const DrainSteps& steps);

 private:
  const ServiceOptions options_;
  const std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::vector<GrpcServerHandle> servers_;
  std::string address_;
  std::unique_ptr<WorkerRegistrar> registrar_;
};

}  // namespace pdserve
