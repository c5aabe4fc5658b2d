// pdserve_prefill_worker: runs prompts, sends their KV to decode workers and
// returns each request's first token.
//
//   pdserve_prefill_worker --model_dir=DIR --router=HOST:INTERNAL_PORT [--port=0]
//
// Flags are read here only and turned into options once.
#include <unistd.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/cli.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/metrics_server.h"
#include "common/process.h"
#include "common/process_metrics.h"
#include "common/worker_registrar.h"
#include "engine/device_peaks.h"
#include "engine/runner_factory.h"
#include "engine/runtime/weight_dtype.h"
#include "kvtransfer/transport_factory.h"
#if defined(PDSERVE_KV_DEVICE_TRANSPORT)
#include "kvtransfer/device/register.h"
#endif
#include "prefill_worker/prefill_engine.h"
#include "prefill_worker/prefill_service.h"

ABSL_FLAG(std::string, model_dir, "",
          "Hugging Face model directory (config.json + model.safetensors)");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind the gRPC and metrics servers to");
ABSL_FLAG(int, port, 0, "gRPC port (0: any free port)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: any free port)");
ABSL_FLAG(std::string, kv_transport, "tcp",
          "KV transport: tcp, or nccl (CUDA builds, device KV: NCCL between GPUs, CUDA IPC between "
          "workers on one GPU)");
ABSL_FLAG(int, kv_stall_timeout_ms, 30000,
          "nccl: a transfer that makes no progress this long fails its pair of workers (the "
          "communicator is aborted; the next request reconnects)");
ABSL_FLAG(std::string, router, "",
          "The router's internal address (host:internal_port) to register with; empty: do not "
          "register");
ABSL_FLAG(std::string, worker_id, "", "Worker id (default prefill-<host>:<port>)");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend");
ABSL_FLAG(int, threads, 0, "Compute threads (0: all cores)");
ABSL_FLAG(pdserve::engine::WeightDtype, weight_dtype, pdserve::engine::WeightDtype::kAuto,
          "How weight matrices are kept in memory: auto (bf16 checkpoints in bf16, else fp32), "
          "f32, bf16 (rounded), int8 (groups of 32 with fp32 scales), w8a8 (int8, and "
          "activations rounded to int8 the same way), int4 (groups of 32 with fp16 scales, "
          "activations rounded to int8; CPU backend only)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20,
          "Bytes of KV cache for prompts being prefilled");
ABSL_FLAG(int, kv_block_size, 16, "Tokens per KV block");
ABSL_FLAG(int, num_kv_blocks, 0, "KV blocks (0: derive from --kv_cache_bytes)");
ABSL_FLAG(int, max_batch_tokens, 4096, "Prompt tokens per prefill step");
ABSL_FLAG(int, max_prefill_chunk_tokens, 512,
          "Run prompts longer than this in chunks of this many tokens, so that a step is short "
          "and a cancelled or expired prompt stops within one chunk (0: whole prompts)");
ABSL_FLAG(int, max_queued_requests, 1024, "Queued prompts before RESOURCE_EXHAUSTED");
ABSL_FLAG(bool, enable_prefix_caching, true,
          "Reuse the cached KV blocks of a prompt's longest cached prefix (shared prompt "
          "prefixes are computed once) and report a digest of them to the router");
ABSL_FLAG(double, peak_flops, 0,
          "Peak FLOP/s of the device for the MFU gauge; 0: measured at start-up (cpu: sgemm; "
          "cuda: a bf16 cuBLAS GEMM)");
ABSL_FLAG(int, drain_timeout_ms, 30000, "On SIGTERM, how long queued prompts may take to finish");
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
  const std::string host = absl::GetFlag(FLAGS_host);
  if (absl::Status s = InitClusterAuthFromFlags(host); !s.ok()) {
    PDSERVE_LOG(ERROR) << s;
    return 2;
  }
  // Before the model loads: the measurement's buffers are freed by then.
  const engine::ResolvedPeak peak = engine::ResolvePeak(
      engine::PeakKind::kFlops, absl::GetFlag(FLAGS_peak_flops), "peak_flops",
      {.backend = absl::GetFlag(FLAGS_backend), .threads = absl::GetFlag(FLAGS_threads)});
  PDSERVE_LOG(INFO) << "MFU peak: " << peak.source;

  engine::RunnerOptions runner_options{.model_dir = absl::GetFlag(FLAGS_model_dir),
                                       .backend = absl::GetFlag(FLAGS_backend),
                                       .kv_block_size = absl::GetFlag(FLAGS_kv_block_size),
                                       .num_kv_blocks = absl::GetFlag(FLAGS_num_kv_blocks),
                                       .kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes),
                                       .num_threads = absl::GetFlag(FLAGS_threads),
                                       .weight_dtype = absl::GetFlag(FLAGS_weight_dtype)};
  auto runner = engine::CreateModelRunner(runner_options);
  if (!runner.ok()) {
    PDSERVE_LOG(ERROR) << "cannot load model: " << runner.status();
    return 1;
  }
  PDSERVE_LOG(INFO) << engine::DescribeRunner(**runner, runner_options);
  auto registry = std::make_shared<prometheus::Registry>();
  prefill::PrefillMetrics metrics(*registry);
  metrics.peak_flops.Set(peak.value);
  RegisterBuildInfo(*registry, runner_options.backend, ModelNameOf(runner_options.model_dir));
  // After the metrics: the sender's completion callbacks may still run while
  // it shuts down, and must find the metrics alive.
#if defined(PDSERVE_KV_DEVICE_TRANSPORT)
  kvtransfer::device::RegisterDeviceKvTransports(
      {.stall_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_stall_timeout_ms))});
#endif
  auto sender =
      kvtransfer::CreateKvSender(absl::GetFlag(FLAGS_kv_transport), (*runner)->kv_regions());
  if (!sender.ok()) {
    PDSERVE_LOG(ERROR) << sender.status();
    return 1;
  }

  auto metrics_server = MetricsServer::Start(registry, host, absl::GetFlag(FLAGS_metrics_port));
  if (!metrics_server.ok()) {
    PDSERVE_LOG(ERROR) << metrics_server.status();
    return 1;
  }

  prefill::PrefillEngineOptions engine_options{
      .max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens),
      .max_prefill_chunk_tokens = absl::GetFlag(FLAGS_max_prefill_chunk_tokens),
      .max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests),
      .enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching),
      .peak_flops = peak.value};
  // Destroyed before the runner and sender it uses.
  auto engine = std::make_unique<prefill::PrefillEngine>(engine_options, runner->get(), &metrics);
  prefill::PrefillService service(engine.get(), sender->get());
  auto grpc_server =
      StartGrpcServer(host, absl::GetFlag(FLAGS_port), {&service}, InternalServerCredentials());
  if (!grpc_server.ok()) {
    PDSERVE_LOG(ERROR) << grpc_server.status();
    return 1;
  }
  const std::string address = JoinHostPort(host, grpc_server->port);
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) worker_id = absl::StrCat("prefill-", address);

  std::unique_ptr<WorkerRegistrar> registrar;
  if (!absl::GetFlag(FLAGS_router).empty()) {
    // Not serving until the router has accepted us (wrong token, router down).
    SetReady(*grpc_server->server, false);
    auto on_registered = [&service, server = grpc_server->server.get()](bool registered) {
      if (!service.draining()) SetReady(*server, registered);
    };
    internal::v1::WorkerInfo info;
    info.set_worker_id(worker_id);
    info.set_role(internal::v1::WORKER_ROLE_PREFILL);
    info.set_address(address);
    info.set_model_fingerprint((*runner)->fingerprint());
    info.set_kv_block_size((*runner)->kv_block_size());
    info.set_metrics_address(JoinHostPort(host, (*metrics_server)->port()));
    const engine::ServedModel served = engine::DescribeServedModel(**runner, runner_options);
    info.set_config_fingerprint(served.config_fingerprint);
    info.set_checkpoint_fingerprint(served.checkpoint_fingerprint);
    info.set_weight_dtype(served.weight_dtype);
    info.set_kv_dtype(served.kv_dtype);
    info.set_kv_layout(served.kv_layout);
    info.set_backend(served.backend);
    registrar = std::make_unique<WorkerRegistrar>(
        absl::GetFlag(FLAGS_router), info,
        [&engine, &service, &engine_options] {
          prefill::PrefillLoad load = engine->load();
          internal::v1::WorkerLoad out;
          out.set_queued_prompt_tokens(load.queued_tokens);
          out.set_queued_requests(load.queued_requests);
          out.mutable_cached_block_hashes()->Assign(load.cached_block_hashes.begin(),
                                                    load.cached_block_hashes.end());
          out.set_draining(service.draining());
          out.set_progress(load.progress);
          out.set_has_work(load.has_work);
          out.set_unhealthy_reason(load.unhealthy_reason);
          out.set_tokens_per_second(load.tokens_per_second);
          out.set_max_batch_tokens(engine_options.max_batch_tokens);
          out.set_max_queued_requests(engine_options.max_queued_requests);
          return out;
        },
        on_registered);
  }

  AnnounceReady(absl::GetFlag(FLAGS_ready_file), address, (*metrics_server)->port());
  PDSERVE_LOG(INFO) << "pdserve " << VersionString() << " prefill worker " << worker_id
                    << " serving on " << address << ", metrics on port "
                    << (*metrics_server)->port();

  const int sig = WaitForShutdownSignal();
  PDSERVE_LOG(INFO) << "signal " << sig << ": draining";
  service.SetDraining(true);
  SetServing(*grpc_server->server, false);
  if (registrar) registrar->Poke();
  WaitUntilIdle(absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)),
                [&] { return engine->load().queued_requests == 0; });
  registrar.reset();
  grpc_server->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  engine.reset();
  PDSERVE_LOG(INFO) << "prefill worker stopped";
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::BlockShutdownSignals();
  pdserve::ParseFlags(
      argc, argv,
      "A prefill worker: runs prompts, sends their KV to decode workers and returns first tokens",
      __FILE__);
  return pdserve::Main();
}
