// pdserve_prefill_worker: runs prompts, sends their KV to decode workers and
// returns each request's first token.
//
//   pdserve_prefill_worker --model_dir=DIR --router=HOST:INTERNAL_PORT [--port=0]
//
// Flags are read here only and turned into options once.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/base/logging.h"
#include "common/service/service_process.h"
#include "engine/device_peaks.h"
#include "engine/runner_factory.h"
#include "engine/runtime/grammar/tokenizer_vocabulary.h"
#include "engine/types/weight_dtype.h"
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
ABSL_FLAG(
    std::string, router, "",
    "The router's internal address (host:internal_port) to register with; empty: do not register");
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
ABSL_FLAG(int, prefill_step_target_ms, 250,
          "Steps last about this long: their prompt tokens are capped at the measured rate times "
          "this (never below one chunk, never above --max_batch_tokens), so a cancelled prompt "
          "or a newly arrived one waits at most about this for the step in progress (0: steps of "
          "--max_batch_tokens)");
ABSL_FLAG(int, max_queued_requests, 1024, "Queued prompts before RESOURCE_EXHAUSTED");
ABSL_FLAG(bool, enable_prefix_caching, true,
          "Reuse the cached KV blocks of a prompt's longest cached prefix (shared prompt prefixes "
          "are computed once) and report a digest of them to the router");
ABSL_FLAG(double, peak_flops, 0,
          "Peak FLOP/s of the device for the MFU gauge; 0: measured at start-up (cpu: sgemm; cuda: "
          "a bf16 cuBLAS GEMM)");
ABSL_FLAG(int, drain_timeout_ms, 30000, "On SIGTERM, how long queued prompts may take to finish");
ABSL_FLAG(std::string, ready_file, "", "Write bound ports here as JSON once serving");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace pdserve {
namespace {

int Main() {
  const std::string host = absl::GetFlag(FLAGS_host);
  ServiceProcess process(
      {.name = "prefill worker",
       .host = host,
       .metrics_port = absl::GetFlag(FLAGS_metrics_port),
       .ready_file = absl::GetFlag(FLAGS_ready_file),
       .log_level = absl::GetFlag(FLAGS_log_level),
       .drain_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms))});
  if (absl::GetFlag(FLAGS_model_dir).empty()) {
    std::cerr << "--model_dir is required\n";
    return 2;
  }
  if (int code = process.Begin(); code != 0) return code;
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
  prefill::PrefillMetrics metrics(process.registry());
  metrics.peak_flops.Set(peak.value);
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
  if (absl::Status s = process.StartMetrics(runner_options.backend, runner_options.model_dir);
      !s.ok()) {
    PDSERVE_LOG(ERROR) << s;
    return 1;
  }

  prefill::PrefillEngineOptions engine_options{
      .max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens),
      .max_prefill_chunk_tokens = absl::GetFlag(FLAGS_max_prefill_chunk_tokens),
      .step_target = absl::Milliseconds(absl::GetFlag(FLAGS_prefill_step_target_ms)),
      .max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests),
      .enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching),
      .peak_flops = peak.value};
  // Destroyed before the runner and sender it uses.
  auto engine = std::make_unique<prefill::PrefillEngine>(engine_options, runner->get(), &metrics);
  // Structured output needs each token's bytes: the tokenizer, once.
  const std::unique_ptr<engine::grammar::GrammarCompiler> grammars =
      engine::grammar::WorkerGrammarCompiler(runner_options.model_dir, (*runner)->config());
  prefill::PrefillService service(engine.get(), sender->get(), grammars.get());
  if (auto port =
          process.AddGrpcServer(absl::GetFlag(FLAGS_port), {&service}, InternalServerCredentials());
      !port.ok()) {
    PDSERVE_LOG(ERROR) << port.status();
    return 1;
  }
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) worker_id = absl::StrCat("prefill-", process.address());

  internal::v1::WorkerInfo info;
  info.set_worker_id(worker_id);
  info.set_role(internal::v1::WORKER_ROLE_PREFILL);
  info.set_model_fingerprint((*runner)->fingerprint());
  info.set_kv_block_size((*runner)->kv_block_size());
  const engine::ServedModel served = engine::DescribeServedModel(**runner, runner_options);
  info.set_config_fingerprint(served.config_fingerprint);
  info.set_checkpoint_fingerprint(served.checkpoint_fingerprint);
  info.set_weight_dtype(served.weight_dtype);
  info.set_kv_dtype(served.kv_dtype);
  info.set_kv_layout(served.kv_layout);
  info.set_backend(served.backend);
  process.RegisterWithRouter(
      absl::GetFlag(FLAGS_router), std::move(info),
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
      [&service] { return service.draining(); });

  process.AnnounceReady({}, absl::StrCat(worker_id, " serving on ", process.address(),
                                         ", metrics on port ", process.metrics_port()));
  return process.ServeUntilSignal(
      {.refuse = [&service] { service.SetDraining(true); },
       .idle = [&engine] { return engine->load().queued_requests == 0; },
       .after = [&engine] { engine.reset(); }});
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::StartProcess(
      argc, argv,
      "A prefill worker: runs prompts, sends their KV to decode workers and returns first tokens",
      __FILE__);
  return pdserve::Main();
}
