// pdserve_colocated: one process that prefills and decodes on one model
// runner (no router, no KV transfer), serving the same pdserve.v1.Generation
// and OpenAI-compatible HTTP APIs as the router of a disaggregated cluster,
// through the same front end. The baseline of the serving benchmark
// (docs/performance.md): same model, same API, same load generator.
//
//   pdserve_colocated --model_dir=DIR [--port=0] [--http_port=0] [--metrics_port=0] [--threads=0]
//
// Flags are read here only and turned into options once.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "colocated/colocated_engine.h"
#include "colocated/colocated_metrics.h"
#include "colocated/colocated_orchestrator.h"
#include "common/base/logging.h"
#include "common/service/service_process.h"
#include "engine/runner_factory.h"
#include "engine/runtime/grammar/tokenizer_vocabulary.h"
#include "engine/types/weight_dtype.h"
#include "frontend/client_metrics.h"
#include "frontend/grpc_service.h"
#include "frontend/openai_http_server.h"
#include "frontend/prompt_source.h"
#include "frontend/request_session.h"

ABSL_FLAG(std::string, model_dir, "",
          "Hugging Face model directory (config.json + model.safetensors)");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind the gRPC, HTTP and metrics servers to");
ABSL_FLAG(int, port, 0, "gRPC port (0: any free port)");
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
ABSL_FLAG(int, max_in_flight, 1024, "Requests served at once before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: any free port)");
ABSL_FLAG(std::string, worker_id, "colocated",
          "Name in the responses' timings (prefill_worker, decode_worker)");
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
ABSL_FLAG(int, max_running, 256, "Sequences in the decode batch at most");
ABSL_FLAG(int, max_prefill_tokens, 4096, "Prompt tokens per prefill step");
ABSL_FLAG(int, max_waiting, 1024, "Queued prompts before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_prefill_chunk_tokens, 0,
          "Run prompts in chunks of this many tokens mixed into decode steps (0: whole prompts in "
          "steps of their own)");
ABSL_FLAG(bool, enable_prefix_caching, true,
          "Reuse the cached KV blocks of a prompt's longest cached prefix");
ABSL_FLAG(int, decode_kv_headroom_tokens, 32,
          "KV tokens reserved beyond the prompt at admission; later tokens take blocks as they "
          "come, and the newest sequences are preempted (recomputed later) when blocks run out. "
          "Negative: every request is reserved whole up front");
ABSL_FLAG(int, drain_timeout_ms, 30000,
          "On SIGTERM, how long in-flight streams may take to finish");
ABSL_FLAG(std::string, ready_file, "", "Write bound ports here as JSON once serving");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace pdserve {
namespace {

int Main() {
  const std::string host = absl::GetFlag(FLAGS_host);
  ServiceProcess process(
      {.name = "colocated server",
       .host = host,
       .metrics_port = absl::GetFlag(FLAGS_metrics_port),
       .ready_file = absl::GetFlag(FLAGS_ready_file),
       .log_level = absl::GetFlag(FLAGS_log_level),
       .cluster_auth = false,  // no internal ports or channels
       .drain_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms))});
  if (absl::GetFlag(FLAGS_model_dir).empty()) {
    std::cerr << "--model_dir is required\n";
    return 2;
  }
  if (int code = process.Begin(); code != 0) return code;
  const engine::RunnerOptions runner_options{.model_dir = absl::GetFlag(FLAGS_model_dir),
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
  // As the router: config, tokenizer and chat template of the model.
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  absl::StatusOr<frontend::PromptSource> prompt_source = frontend::PromptSource::Load(model_dir);
  if (!prompt_source.ok()) {
    PDSERVE_LOG(ERROR) << prompt_source.status();
    return 1;
  }

  frontend::ClientMetrics client_metrics(process.registry());
  colocated::ColocatedMetrics engine_metrics(process.registry());
  if (absl::Status s = process.StartMetrics(absl::GetFlag(FLAGS_backend), model_dir); !s.ok()) {
    PDSERVE_LOG(ERROR) << s;
    return 1;
  }

  // Destroyed before the runner it uses.
  auto engine = std::make_unique<colocated::ColocatedEngine>(
      colocated::ColocatedOptions{
          .max_running = absl::GetFlag(FLAGS_max_running),
          .max_prefill_tokens = absl::GetFlag(FLAGS_max_prefill_tokens),
          .max_waiting = absl::GetFlag(FLAGS_max_waiting),
          .max_prefill_chunk_tokens = absl::GetFlag(FLAGS_max_prefill_chunk_tokens),
          .enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching),
          .kv_headroom_tokens = absl::GetFlag(FLAGS_decode_kv_headroom_tokens)},
      runner->get(), &engine_metrics);
  // Structured output needs each token's bytes: the tokenizer, once.
  const std::unique_ptr<engine::grammar::GrammarCompiler> grammars =
      engine::grammar::WorkerGrammarCompiler(runner_options.model_dir, (*runner)->config());
  colocated::ColocatedOrchestrator orchestrator(engine.get(), absl::GetFlag(FLAGS_worker_id),
                                                grammars.get());
  const int max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  frontend::SessionManager sessions(
      frontend::SessionOptions{
          .max_in_flight = max_in_flight,
          .validation = {.max_prompt_bytes = absl::GetFlag(FLAGS_max_prompt_bytes)},
          .server_kind = "server"},
      &*prompt_source, &orchestrator, &client_metrics);
  frontend::GrpcGenerationService service(&sessions);
  if (auto port = process.AddGrpcServer(absl::GetFlag(FLAGS_port), {&service}, nullptr,
                                        /*max_receive_message_bytes=*/-1);
      !port.ok()) {
    PDSERVE_LOG(ERROR) << port.status();
    return 1;
  }
  auto http_server = frontend::StartOpenAiHttpFromFlags(
      host, absl::GetFlag(FLAGS_http_port), absl::GetFlag(FLAGS_model_name), model_dir,
      max_in_flight, &sessions, absl::GetFlag(FLAGS_tool_call_parser), absl::GetFlag(FLAGS_max_n));
  if (!http_server.ok()) {
    PDSERVE_LOG(ERROR) << http_server.status();
    return 1;
  }
  const int http_port = *http_server ? (*http_server)->port() : -1;
  process.AnnounceReady(
      {{"http_port", absl::StrCat(http_port)}},
      absl::StrCat("on ", process.address(), ", HTTP on port ", http_port, ", metrics on port ",
                   process.metrics_port(), ", ", (*runner)->num_kv_blocks(), " KV blocks"));
  return process.ServeUntilSignal(
      {.refuse = [&sessions] { sessions.SetDraining(true); },
       .idle = [&sessions] { return sessions.in_flight() == 0; },
       // Both servers end the requests still open and wait for their
       // handlers, which release the engine's streams before the engine goes.
       .close = [&http_server] { http_server->reset(); },
       .after = [&engine] { engine.reset(); }});
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::StartProcess(
      argc, argv,
      "Prefill and decode in one process behind the Generate API (the serving benchmark baseline)",
      __FILE__);
  return pdserve::Main();
}
