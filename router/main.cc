// pdserve_router: the client-facing APIs (gRPC pdserve.v1.Generation and
// OpenAI-compatible HTTP, both over the front end's request sessions), the
// worker registry and the orchestration of prefill and decode workers.
//
//   pdserve_router --model_dir=DIR [--port=0] [--internal_port=0] [--http_port=0]
//                  [--metrics_port=0] [--cluster_token_file=F] [--tls_cert_file=C --tls_key_file=K]
//
// Clients use --port (Generation, health, reflection; TLS when a certificate
// is given) and --http_port; workers register on --internal_port, where every
// call must carry the cluster token when one is configured (common/auth.h).
//
// Flags are read here only and turned into options once.
#include <unistd.h>

#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "common/grpc_util.h"
#include "common/memory.h"
#include "common/service/service_process.h"
#include "engine/model/weight_source.h"
#include "engine/model/weights.h"
#include "engine/types/weight_dtype.h"
#include "frontend/client_metrics.h"
#include "frontend/grpc_service.h"
#include "frontend/openai_http_server.h"
#include "frontend/prompt_source.h"
#include "frontend/request_session.h"
#include "router/disaggregated_orchestrator.h"
#include "router/registry_service.h"
#include "router/router_metrics.h"

ABSL_FLAG(std::string, model_dir, "",
          "Model directory; the router reads config.json and generation_config.json (vocabulary, "
          "context, BOS/EOS), the tokenizer files and the chat template");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind the gRPC, HTTP and metrics servers to");
ABSL_FLAG(int, port, 0, "gRPC port for clients (0: any free port)");
ABSL_FLAG(
    int, internal_port, 0,
    "gRPC port for worker registration, authenticated by the cluster token (0: any free port)");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain for TLS on the client gRPC port (with --tls_key_file); empty: "
          "plaintext");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(int, http_port, 0, "OpenAI-compatible HTTP port (0: any free port; -1: no HTTP server)");
ABSL_FLAG(int, max_n, 16,
          "Most choices (OpenAI n) one request may ask for; each is a sequence of its own and "
          "counts against --max_in_flight");
ABSL_FLAG(std::string, tool_call_parser, "auto",
          "Tool-call format of the model's replies: auto (from the chat template), hermes "
          "(<tool_call> JSON </tool_call>), llama3_json, none");
ABSL_FLAG(std::string, model_name, "",
          "Model name of the OpenAI API (empty: config.json's _name_or_path, else the last "
          "component of --model_dir)");
ABSL_FLAG(int64_t, max_prompt_bytes, 0,
          "Largest prompt text in bytes, refused before tokenization (0: 16 x the model's context "
          "length)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: any free port)");
ABSL_FLAG(int, max_in_flight, 1024, "Requests served at once before RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, routing_policy, "prefix_aware",
          "Routing policy: prefix_aware (prefill workers likely to hold the prompt's prefix, "
          "unless loaded) or least_loaded");
ABSL_FLAG(int, heartbeat_interval_ms, 500, "Heartbeat interval asked of workers");
ABSL_FLAG(int, worker_timeout_ms, 3000, "A worker silent this long is dropped");
ABSL_FLAG(int, max_attempts, 3,
          "Placements a request may use in all: retries before its first token and migrations to "
          "another worker pair after it");
ABSL_FLAG(int, stall_timeout_ms, 30000,
          "A decode worker that does not answer a reservation, or a prefill worker that does not "
          "accept a prompt, this long is given up for that request alone when another worker can "
          "be tried (the worker stays in service; this costs the request no attempt); the only "
          "choice is waited for (0: never)");
ABSL_FLAG(int, worker_hang_timeout_ms, 30000,
          "A worker with work whose engine completes no step for this long is hung: out of "
          "service, and its requests move, until its steps move again (0: never). Longer than the "
          "longest engine step");
ABSL_FLAG(int, max_queued_requests, 1024,
          "Requests that wait at the router for the pools to have room; beyond, RESOURCE_EXHAUSTED "
          "with a retry hint");
ABSL_FLAG(int, max_queue_wait_ms, 120000,
          "Longest wait at the router for room; then RESOURCE_EXHAUSTED with a retry hint");
ABSL_FLAG(int, prefill_queue_batches, 4,
          "Prompts are sent to a prefill worker while the tokens queued there stay under this many "
          "of its steps (--max_batch_tokens); the rest wait at the router");
ABSL_FLAG(double, prefill_queue_seconds, 0,
          "And (> 0) while they take at most this many seconds at the worker's reported rate: the "
          "rest wait at the router, so a prefill worker that joins takes the backlog at once "
          "(0: the steps bound alone)");
ABSL_FLAG(std::string, weight_dtype, "",
          "Weight storage every worker must serve (auto, f32, bf16, int8, w8a8, int4); empty: not "
          "checked (prefill and decode workers are paired only where their models as served are "
          "equal)");
ABSL_FLAG(std::string, kv_dtype, "",
          "KV element type every worker must have (f32: the CPU backend, bf16: CUDA); empty: not "
          "checked (prefill and decode workers are paired only where their KV matches)");
ABSL_FLAG(int, drain_timeout_ms, 30000,
          "On SIGTERM, how long in-flight streams may take to finish");
ABSL_FLAG(std::string, ready_file, "", "Write bound ports here as JSON once serving");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace pdserve {
namespace {

int Main() {
  const std::string host = absl::GetFlag(FLAGS_host);
  ServiceProcess process(
      {.name = "router",
       .host = host,
       .metrics_port = absl::GetFlag(FLAGS_metrics_port),
       .ready_file = absl::GetFlag(FLAGS_ready_file),
       .log_level = absl::GetFlag(FLAGS_log_level),
       .drain_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms))});
  if (!SetLogLevelFlag(absl::GetFlag(FLAGS_log_level))) return 2;
  if (absl::GetFlag(FLAGS_model_dir).empty()) {
    std::cerr << "--model_dir is required\n";
    return 2;
  }
  if (!(absl::GetFlag(FLAGS_prefill_queue_seconds) >= 0)) {
    std::cerr << "--prefill_queue_seconds must be >= 0\n";
    return 2;
  }
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  absl::StatusOr<frontend::PromptSource> prompt_source = frontend::PromptSource::Load(model_dir);
  if (!prompt_source.ok()) {
    PDSERVE_LOG(ERROR) << prompt_source.status();
    return 1;
  }
  auto policy = router::CreateRoutingPolicy(absl::GetFlag(FLAGS_routing_policy));
  if (!policy.ok()) {
    PDSERVE_LOG(ERROR) << policy.status();
    return 2;
  }
  if (int code = process.Begin(); code != 0) return code;
  auto client_credentials =
      ServerTlsCredentials(absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file));
  if (!client_credentials.ok()) {
    PDSERVE_LOG(ERROR) << client_credentials.status();
    return 2;
  }

  frontend::ClientMetrics client_metrics(process.registry());
  router::RouterMetrics metrics(process.registry());
  if (absl::Status s = process.StartMetrics("none", model_dir); !s.ok()) {
    PDSERVE_LOG(ERROR) << s;
    return 1;
  }

  // The router's own model is the reference every worker is checked
  // against at registration. A --weight_dtype no worker can serve would
  // refuse them all: refused here instead.
  if (const std::string dtype = absl::GetFlag(FLAGS_weight_dtype); !dtype.empty()) {
    if (absl::StatusOr<engine::WeightDtype> parsed = engine::ParseWeightDtype(dtype);
        !parsed.ok()) {
      PDSERVE_LOG(ERROR) << "--weight_dtype: " << parsed.status().message();
      return 2;
    }
  }
  router::ModelReference reference{
      .config_fingerprint = engine::ConfigFingerprint(prompt_source->config),
      .weight_dtype = absl::GetFlag(FLAGS_weight_dtype),
      .kv_dtype = absl::GetFlag(FLAGS_kv_dtype)};
  if (absl::StatusOr<uint64_t> checkpoint =
          engine::CheckpointFingerprint(prompt_source->config, model_dir);
      checkpoint.ok()) {
    reference.checkpoint_fingerprint = *checkpoint;
  } else {
    PDSERVE_LOG(WARNING) << "workers are checked against config.json only: "
                         << checkpoint.status().message();
  }
  const absl::Duration stall_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_stall_timeout_ms));
  router::WorkerRegistry workers(
      {.ttl = absl::Milliseconds(absl::GetFlag(FLAGS_worker_timeout_ms)),
       .hang_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_worker_hang_timeout_ms)),
       .reference = reference});
  router::RegistryService registry_service(
      &workers, absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms)));
  router::DisaggregatedOrchestrator orchestrator(
      &workers, policy->get(), &metrics,
      {.max_attempts = absl::GetFlag(FLAGS_max_attempts),
       .stall_timeout = stall_timeout,
       .model = &prompt_source->config,
       .admission = {.max_queued = absl::GetFlag(FLAGS_max_queued_requests),
                     .max_wait = absl::Milliseconds(absl::GetFlag(FLAGS_max_queue_wait_ms)),
                     .prefill_queue_batches = absl::GetFlag(FLAGS_prefill_queue_batches),
                     .prefill_queue_seconds = absl::GetFlag(FLAGS_prefill_queue_seconds)},
       .empty_pool_retry_after =
           absl::Milliseconds(std::max(1000, 2 * absl::GetFlag(FLAGS_heartbeat_interval_ms)))});
  const int max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  frontend::SessionManager sessions(
      frontend::SessionOptions{
          .max_in_flight = max_in_flight,
          .validation = {.max_prompt_bytes = absl::GetFlag(FLAGS_max_prompt_bytes)},
          .server_kind = "router"},
      &*prompt_source, &orchestrator, &client_metrics);
  frontend::GrpcGenerationService generation(&sessions);
  // The service refuses messages over kMaxGrpcMessageBytes itself, so that
  // the refusal is counted (frontend/grpc_service.h).
  if (auto port =
          process.AddGrpcServer(absl::GetFlag(FLAGS_port), {&generation}, *client_credentials,
                                /*max_receive_message_bytes=*/-1);
      !port.ok()) {
    PDSERVE_LOG(ERROR) << port.status();
    return 1;
  }
  absl::StatusOr<int> internal_port = process.AddGrpcServer(
      absl::GetFlag(FLAGS_internal_port), {&registry_service}, InternalServerCredentials());
  if (!internal_port.ok()) {
    PDSERVE_LOG(ERROR) << internal_port.status();
    return 1;
  }
  auto http_server = frontend::StartOpenAiHttpFromFlags(
      host, absl::GetFlag(FLAGS_http_port), absl::GetFlag(FLAGS_model_name), model_dir,
      max_in_flight, &sessions, absl::GetFlag(FLAGS_tool_call_parser), absl::GetFlag(FLAGS_max_n));
  if (!http_server.ok()) {
    PDSERVE_LOG(ERROR) << http_server.status();
    return 1;
  }

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

  const int http_port = *http_server ? (*http_server)->port() : -1;
  process.AnnounceReady(
      {{"http_port", absl::StrCat(http_port)}, {"internal_port", absl::StrCat(*internal_port)}},
      absl::StrCat("serving on ", process.address(), ", internal on port ", *internal_port,
                   ", HTTP on port ", http_port, ", metrics on port ", process.metrics_port(),
                   ", model ", model_dir, " (", prompt_source->config.architecture, ", context ",
                   prompt_source->config.max_position_embeddings, ", text ",
                   prompt_source->text_unavailable.empty() ? "served" : "unavailable", ")"));
  return process.ServeUntilSignal({.refuse = [&sessions] { sessions.SetDraining(true); },
                                   .idle = [&sessions] { return sessions.in_flight() == 0; },
                                   .close = [&http_server] { http_server->reset(); },
                                   .after =
                                       [&stop, &pool_watch] {
                                         stop.store(true);
                                         pool_watch.join();
                                       }});
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::ConfigureAllocatorForRequests();
  pdserve::StartProcess(argc, argv,
                        "The client-facing APIs (gRPC Generate, OpenAI-compatible HTTP), the "
                        "worker registry and the orchestration of the workers of a pdserve cluster",
                        __FILE__);
  return pdserve::Main();
}
