// pdserve_decode_worker: receives KV from prefill workers and streams the
// remaining tokens of each request with continuous batching.
//
//   pdserve_decode_worker --model_dir=DIR --router=HOST:INTERNAL_PORT [--port=0] [--kv_port=0]
//
// Flags are read here only and turned into options once.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/base/logging.h"
#include "common/service/service_process.h"
#include "decode_worker/decode_engine.h"
#include "decode_worker/decode_service.h"
#include "engine/device_peaks.h"
#include "engine/runner_factory.h"
#include "engine/runtime/grammar/tokenizer_vocabulary.h"
#include "engine/spec/spec_factory.h"
#include "engine/types/weight_dtype.h"
#include "kvtransfer/transport_factory.h"
#if defined(PDSERVE_KV_DEVICE_TRANSPORT)
#include "kvtransfer/device/register.h"
#endif

ABSL_FLAG(std::string, model_dir, "",
          "Hugging Face model directory (config.json + model.safetensors)");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind the gRPC, metrics and KV servers to");
ABSL_FLAG(int, port, 0, "gRPC port (0: any free port)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: any free port)");
ABSL_FLAG(std::string, kv_transport, "tcp",
          "KV transport: tcp, or nccl (CUDA builds, device KV: NCCL between GPUs, CUDA IPC between "
          "workers on one GPU)");
ABSL_FLAG(int, kv_stall_timeout_ms, 30000,
          "nccl: a transfer that makes no progress this long fails its pair of workers (the "
          "communicator is aborted; the next request reconnects)");
ABSL_FLAG(int, kv_port, 0, "KV receiver port (0: any free port)");
ABSL_FLAG(
    std::string, router, "",
    "The router's internal address (host:internal_port) to register with; empty: do not register");
ABSL_FLAG(std::string, worker_id, "", "Worker id (default decode-<host>:<port>)");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend");
ABSL_FLAG(int, threads, 0, "Compute threads (0: all cores)");
ABSL_FLAG(pdserve::engine::WeightDtype, weight_dtype, pdserve::engine::WeightDtype::kAuto,
          "How weight matrices are kept in memory: auto (bf16 checkpoints in bf16, else fp32), "
          "f32, bf16 (rounded), int8 (groups of 32 with fp32 scales), w8a8 (int8, and "
          "activations rounded to int8 the same way), int4 (groups of 32 with fp16 scales, "
          "activations rounded to int8; CPU backend only)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{512} << 20, "Bytes of KV cache");
ABSL_FLAG(int, kv_block_size, 16, "Tokens per KV block");
ABSL_FLAG(int, num_kv_blocks, 0, "KV blocks (0: derive from --kv_cache_bytes)");
ABSL_FLAG(int, max_running, 256, "Sequences held at once (running + waiting for KV)");
ABSL_FLAG(int, decode_kv_headroom_tokens, 32,
          "KV tokens reserved beyond the prompt at admission; later tokens take blocks as they "
          "come, and the newest sequences are preempted (recomputed later) when blocks run out. "
          "Negative: every request is reserved whole up front");
ABSL_FLAG(bool, enable_prefix_caching, true,
          "Keep computed KV blocks cached (evictable) so a preempted sequence's recomputation "
          "reuses what is still there");
ABSL_FLAG(int, kv_timeout_ms, 600000,
          "For a request whose call carries no deadline: time from admission until its KV must "
          "have arrived (otherwise the call's deadline, the request's budget, bounds the wait)");
ABSL_FLAG(double, peak_memory_bandwidth, 0,
          "Peak memory bandwidth in bytes/s for the utilisation gauge; 0: from the backend (cpu: a "
          "triad measured at start-up; cuda: the device's memory clock x bus width)");
ABSL_FLAG(std::string, speculative, "off",
          "Speculative decoding: off, ngram (prompt lookup: proposes what followed the latest "
          "match of the last tokens in the prompt and output) or draft (a smaller model of the "
          "same tokenizer, --draft_model_dir)");
ABSL_FLAG(int, num_speculative_tokens, 0,
          "Tokens proposed per sequence and step, at most (0: the method's default, 6 for ngram "
          "and 4 for draft)");
ABSL_FLAG(std::string, draft_model_dir, "", "The draft model of --speculative=draft");
ABSL_FLAG(bool, speculative_adaptive, true,
          "Each sequence's proposal length follows its acceptance, and a sequence whose "
          "acceptance is low stops proposing for a while");
ABSL_FLAG(int, speculative_max_batch, -1,
          "No proposals in a step with more decoding sequences than this (-1: the method's "
          "default, 2 for ngram and 1 for draft; 0: no limit): on the CPU backend a step of 3 or "
          "more sequences' verification rows is compute-bound and speculation loses there, and at "
          "2 a draft's own steps cost more than its proposals gain; a GPU, where verification "
          "rows cost little, takes more");
ABSL_FLAG(double, speculative_draft_cost, 0,
          "One draft step's cost in target decode steps, which prices a draft's proposals "
          "against their acceptance (0: estimated from the two models' sizes)");
ABSL_FLAG(double, speculative_row_cost, 0,
          "One verification row's cost beyond the first, in target decode steps, in that "
          "pricing (0: the backend's figure; cpu: 0.2 with AVX-512, 0.5 with AVX2, 1 without "
          "either, measured on the demo model)");
ABSL_FLAG(int, stream_interval, 1,
          "Tokens of a stream sent to the router in one message (1: each as it is sampled; N: "
          "bursts of N steps, N times fewer messages per token for this worker and the router)");
ABSL_FLAG(int, drain_timeout_ms, 30000, "On SIGTERM, how long running requests may take to finish");
ABSL_FLAG(std::string, ready_file, "", "Write bound ports here as JSON once serving");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace pdserve {
namespace {

int Main() {
  const std::string host = absl::GetFlag(FLAGS_host);
  ServiceProcess process(
      {.name = "decode worker",
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
      engine::PeakKind::kMemoryBandwidth, absl::GetFlag(FLAGS_peak_memory_bandwidth),
      "peak_memory_bandwidth",
      {.backend = absl::GetFlag(FLAGS_backend), .threads = absl::GetFlag(FLAGS_threads)});
  PDSERVE_LOG(INFO) << "memory bandwidth peak: " << peak.source;

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
#if defined(PDSERVE_KV_DEVICE_TRANSPORT)
  kvtransfer::device::RegisterDeviceKvTransports(
      {.stall_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_stall_timeout_ms))});
#endif
  auto receiver =
      kvtransfer::CreateKvReceiver(absl::GetFlag(FLAGS_kv_transport), host,
                                   absl::GetFlag(FLAGS_kv_port), (*runner)->kv_regions());
  if (!receiver.ok()) {
    PDSERVE_LOG(ERROR) << "cannot start KV receiver: " << receiver.status();
    return 1;
  }

  decode::DecodeMetrics metrics(process.registry());
  metrics.peak_memory_bandwidth.Set(peak.value);
  if (absl::Status s = process.StartMetrics(runner_options.backend, runner_options.model_dir);
      !s.ok()) {
    PDSERVE_LOG(ERROR) << s;
    return 1;
  }

  absl::StatusOr<engine::spec::SpecMethod> spec_method =
      engine::spec::ParseSpecMethod(absl::GetFlag(FLAGS_speculative));
  if (!spec_method.ok()) {
    PDSERVE_LOG(ERROR) << spec_method.status();
    return 2;
  }
  auto spec = engine::spec::CreateSpecDecoder(
      {.method = *spec_method,
       .num_speculative_tokens = absl::GetFlag(FLAGS_num_speculative_tokens),
       .adaptive = absl::GetFlag(FLAGS_speculative_adaptive),
       .max_batch = absl::GetFlag(FLAGS_speculative_max_batch),
       .draft_cost = absl::GetFlag(FLAGS_speculative_draft_cost),
       .row_cost = absl::GetFlag(FLAGS_speculative_row_cost),
       .draft_model_dir = absl::GetFlag(FLAGS_draft_model_dir),
       .backend = runner_options.backend,
       .num_threads = runner_options.num_threads},
      **runner);
  if (!spec.ok()) {
    PDSERVE_LOG(ERROR) << "speculative decoding: " << spec.status();
    return 2;
  }
  if (*spec != nullptr) {
    PDSERVE_LOG(INFO) << "speculative decoding: " << (*spec)->proposer().name() << ", up to "
                      << (*spec)->num_speculative_tokens() << " tokens, up to "
                      << (*spec)->options().max_batch << " decoding sequences (0: any)";
    if ((*spec)->options().proposal_cost > 0) {
      PDSERVE_LOG(INFO) << "speculative decoding: a proposed token costs "
                        << (*spec)->options().proposal_cost << " target steps, a verification row "
                        << (*spec)->options().row_cost;
    }
  }

  decode::DecodeEngineOptions engine_options{
      .max_running = absl::GetFlag(FLAGS_max_running),
      .kv_headroom_tokens = absl::GetFlag(FLAGS_decode_kv_headroom_tokens),
      .enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching),
      .kv_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_timeout_ms)),
      .peak_memory_bandwidth = peak.value};
  // Destroyed before the receiver and the runner it uses.
  auto engine = std::make_unique<decode::DecodeEngine>(engine_options, runner->get(),
                                                       receiver->get(), &metrics, *std::move(spec));
  // Structured output needs each token's bytes: the tokenizer, once.
  const std::unique_ptr<engine::grammar::GrammarCompiler> grammars =
      engine::grammar::WorkerGrammarCompiler(runner_options.model_dir, (*runner)->config());
  if (absl::GetFlag(FLAGS_stream_interval) < 1) {
    PDSERVE_LOG(ERROR) << "--stream_interval must be at least 1";
    return 2;
  }
  decode::DecodeService service(engine.get(), grammars.get(), absl::GetFlag(FLAGS_stream_interval));
  if (auto port =
          process.AddGrpcServer(absl::GetFlag(FLAGS_port), {&service}, InternalServerCredentials());
      !port.ok()) {
    PDSERVE_LOG(ERROR) << port.status();
    return 1;
  }
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) worker_id = absl::StrCat("decode-", process.address());

  internal::v1::WorkerInfo info;
  info.set_worker_id(worker_id);
  info.set_role(internal::v1::WORKER_ROLE_DECODE);
  info.set_kv_endpoint(engine->kv_endpoint());
  info.set_model_fingerprint((*runner)->fingerprint());
  info.set_kv_block_size((*runner)->kv_block_size());
  info.set_kv_headroom_tokens(absl::GetFlag(FLAGS_decode_kv_headroom_tokens));
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
        decode::DecodeLoad load = engine->load();
        internal::v1::WorkerLoad out;
        out.set_running_sequences(load.running + load.waiting_kv + load.preempted);
        out.set_free_kv_blocks(load.free_blocks);
        out.set_total_kv_blocks(load.total_blocks);
        out.set_draining(service.draining());
        out.set_progress(load.progress);
        out.set_has_work(load.has_work);
        out.set_unhealthy_reason(load.unhealthy_reason);
        out.set_max_sequences(engine_options.max_running);
        return out;
      },
      [&service] { return service.draining(); });

  process.AnnounceReady(
      {{"kv_endpoint", engine->kv_endpoint()}},
      absl::StrCat(worker_id, " serving on ", process.address(), ", KV on ", engine->kv_endpoint(),
                   ", metrics on port ", process.metrics_port(), ", ", (*runner)->num_kv_blocks(),
                   " KV blocks"));
  return process.ServeUntilSignal({.refuse = [&service] { service.SetDraining(true); },
                                   .idle =
                                       [&engine] {
                                         const decode::DecodeLoad load = engine->load();
                                         return load.running + load.waiting_kv + load.preempted ==
                                                0;
                                       },
                                   .after = [&engine] { engine.reset(); }});
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::StartProcess(
      argc, argv,
      "A decode worker: receives KV from prefill workers and streams the remaining tokens",
      __FILE__);
  return pdserve::Main();
}
