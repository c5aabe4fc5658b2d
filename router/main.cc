// pdserve_router: the client-facing Generate API, the worker registry and
// the stream proxy.
//
//   pdserve_router --model_dir=DIR [--port=0] [--metrics_port=0]
//
// Flags are read here only and turned into options once.
#include <unistd.h>

#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/cli.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/metrics_server.h"
#include "common/process.h"
#include "common/process_metrics.h"
#include "router/generation_service.h"
#include "router/prompt_source.h"
#include "router/registry_service.h"
#include "router/router_metrics.h"

ABSL_FLAG(std::string, model_dir, "",
          "Model directory; the router reads config.json and generation_config.json (vocabulary, "
          "context, BOS/EOS), the tokenizer files and the chat template");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind the gRPC and metrics servers to");
ABSL_FLAG(int, port, 0, "gRPC port for clients and worker registration (0: any free port)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: any free port)");
ABSL_FLAG(int, max_in_flight, 1024, "Requests served at once before RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, routing_policy, "prefix_aware",
          "Routing policy: prefix_aware (prefill workers likely to hold the prompt's prefix, "
          "unless loaded) or least_loaded");
ABSL_FLAG(int, heartbeat_interval_ms, 500, "Heartbeat interval asked of workers");
ABSL_FLAG(int, worker_timeout_ms, 3000, "A worker silent this long is dropped");
ABSL_FLAG(int, drain_timeout_ms, 30000,
          "On SIGTERM, how long in-flight streams may take to finish");
ABSL_FLAG(std::string, ready_file, "", "Write bound ports here as JSON once serving");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace pdserve {
namespace {

int Main() {
  if (!SetLogLevelFlag(absl::GetFlag(FLAGS_log_level))) return 2;
  if (absl::GetFlag(FLAGS_model_dir).empty()) {
    std::cerr << "--model_dir is required\n";
    return 2;
  }
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  absl::StatusOr<router::PromptSource> prompt_source = router::PromptSource::Load(model_dir);
  if (!prompt_source.ok()) {
    PDSERVE_LOG(ERROR) << prompt_source.status();
    return 1;
  }
  auto policy = router::CreateRoutingPolicy(absl::GetFlag(FLAGS_routing_policy));
  if (!policy.ok()) {
    PDSERVE_LOG(ERROR) << policy.status();
    return 2;
  }
  const std::string host = absl::GetFlag(FLAGS_host);

  auto registry = std::make_shared<prometheus::Registry>();
  router::RouterMetrics metrics(*registry);
  RegisterBuildInfo(*registry, "none", ModelNameOf(model_dir));
  auto metrics_server = MetricsServer::Start(registry, host, absl::GetFlag(FLAGS_metrics_port));
  if (!metrics_server.ok()) {
    PDSERVE_LOG(ERROR) << metrics_server.status();
    return 1;
  }

  router::WorkerRegistry workers(absl::Milliseconds(absl::GetFlag(FLAGS_worker_timeout_ms)));
  router::RegistryService registry_service(
      &workers, absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms)));
  router::GenerationService generation(
      router::GenerationOptions{.max_in_flight = absl::GetFlag(FLAGS_max_in_flight)},
      &*prompt_source, &workers, policy->get(), &metrics);
  auto grpc_server =
      StartGrpcServer(host, absl::GetFlag(FLAGS_port), {&generation, &registry_service});
  if (!grpc_server.ok()) {
    PDSERVE_LOG(ERROR) << grpc_server.status();
    return 1;
  }
  const std::string address = JoinHostPort(host, grpc_server->port);

  // Keeps the pool-size gauges current (and expires silent workers).
  std::atomic<bool> stop{false};
  std::thread pool_watch([&] {
    while (!stop.load()) {
      metrics.pool_size.Add({{"pool", "prefill"}})
          .Set(workers.CountLive(router::Role::kPrefill, absl::Now()));
      metrics.pool_size.Add({{"pool", "decode"}})
          .Set(workers.CountLive(router::Role::kDecode, absl::Now()));
      absl::SleepFor(absl::Milliseconds(250));
    }
  });

  AnnounceReady(absl::GetFlag(FLAGS_ready_file), address, (*metrics_server)->port());
  PDSERVE_LOG(INFO) << "pdserve " << VersionString() << " router serving on " << address
                    << ", metrics on port " << (*metrics_server)->port();

  const int sig = WaitForShutdownSignal();
  PDSERVE_LOG(INFO) << "signal " << sig << ": draining";
  generation.SetDraining(true);
  SetServing(*grpc_server->server, false);
  WaitUntilIdle(absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)),
                [&] { return generation.in_flight() == 0; });
  grpc_server->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  stop.store(true);
  pool_watch.join();
  PDSERVE_LOG(INFO) << "router stopped";
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::BlockShutdownSignals();
  pdserve::ParseFlags(argc, argv,
                      "The client-facing Generate API, the worker registry and the stream proxy of "
                      "a pdserve cluster",
                      __FILE__);
  return pdserve::Main();
}
