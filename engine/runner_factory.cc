// CreateModelRunner: reads a Hugging Face model directory (config.json,
// generation_config.json when present, model.safetensors or a sharded
// index) and builds the runner of the requested backend.
#include "engine/runner_factory.h"

#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "engine/cpu/blas_core.h"
#include "engine/cpu/cpu_model_runner.h"
#include "engine/model/config.h"
#include "engine/model/weight_source.h"
#include "engine/model/weights.h"
#if defined(PDSERVE_WITH_CUDA_BACKEND)
#include "engine/cuda/cuda_backend.h"
#endif

namespace pdserve::engine {
const BackendHooks* FindBackend(std::string_view name) {
  if (const BackendHooks* hooks = FindRegisteredBackend(name)) return hooks;
#if defined(PDSERVE_WITH_CUDA_BACKEND)
  if (name == "cuda") {
    static const BackendHooks hooks = cuda::CudaBackendHooks();
    return &hooks;
  }
#endif
  return nullptr;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(const RunnerOptions& options) {
  if (options.kv_block_size < 1 || options.num_kv_blocks < 0 || options.kv_cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("runner options: kv_block_size must be >= 1 (got ", options.kv_block_size,
                     "), num_kv_blocks and kv_cache_bytes >= 0 (got ", options.num_kv_blocks, ", ",
                     options.kv_cache_bytes, ")"));
  }
  if (options.backend != "cpu") {
    if (const BackendHooks* hooks = FindBackend(options.backend)) return hooks->create(options);
    if (options.backend == "cuda") {
      return absl::InvalidArgumentError(
          "cuda backend not built (configure with -DPDSERVE_ENABLE_CUDA=ON)");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend \"", options.backend, "\" (expected \"cpu\" or \"cuda\")"));
  }
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(options.model_dir);
  if (!config.ok()) return config.status();
  // Tensors as stored: each backend converts them one at a time.
  absl::StatusOr<std::unique_ptr<WeightSource>> weights =
      WeightSource::Open(*config, options.model_dir);
  if (!weights.ok()) return weights.status();

  CpuRunnerOptions cpu;
  cpu.kv_block_size = options.kv_block_size;
  cpu.num_threads = options.num_threads;
  cpu.weight_dtype = options.weight_dtype;
  cpu.num_kv_blocks = KvBlocksFor(options, *config, sizeof(float));  // fp32 KV
  absl::StatusOr<std::unique_ptr<CpuModelRunner>> runner = CpuModelRunner::Create(**weights, cpu);
  if (!runner.ok()) return runner.status();
  // OpenBLAS's kernels are chosen when it is loaded: say so once if they
  // are narrower than this CPU (engine/cpu/blas_core.h).
  static std::once_flag blas_checked;
  std::call_once(blas_checked, [] {
    const std::string warning = cpu::OpenBlasCoreWarning();
    if (!warning.empty()) PDSERVE_LOG(WARNING) << warning;
  });
  return std::unique_ptr<ModelRunner>(std::move(*runner));
}

std::string DescribeRunner(const ModelRunner& runner, const RunnerOptions& options) {
  const ModelConfig& c = runner.config();
  const std::string threads =
      options.num_threads > 0
          ? absl::StrCat("threads ", options.num_threads)
          : absl::StrCat("threads ", std::max(1u, std::thread::hardware_concurrency()),
                         " (all cores)");
  const int64_t kv_tokens = int64_t{runner.num_kv_blocks()} * runner.kv_block_size();
  return absl::StrFormat(
      "model %s (%s, %d layers, hidden %d, vocab %d, context %d), backend %s, weights %s "
      "(%.1f MiB read per decode step), %s, KV %d blocks x %d tokens = %d tokens (%s)",
      options.model_dir, c.architecture, c.num_layers, c.hidden_size, c.vocab_size,
      c.max_position_embeddings, runner.backend(),
      options.weight_dtype == WeightDtype::kAuto
          ? "as stored"
          : std::string(WeightDtypeName(options.weight_dtype)),
      static_cast<double>(runner.DecodeWeightBytes()) / (1 << 20), threads, runner.num_kv_blocks(),
      runner.kv_block_size(), kv_tokens, KvDtypeName(runner.kv_dtype()));
}

ServedModel DescribeServedModel(const ModelRunner& runner, const RunnerOptions& options) {
  ServedModel out{.config_fingerprint = ConfigFingerprint(runner.config()),
                  .weight_dtype = std::string(WeightDtypeName(options.weight_dtype)),
                  .kv_dtype = std::string(KvDtypeName(runner.kv_dtype())),
                  .kv_layout = std::string(kKvLayoutPagedNhd),
                  .backend = std::string(runner.backend())};
  absl::StatusOr<uint64_t> checkpoint = CheckpointFingerprint(runner.config(), options.model_dir);
  if (checkpoint.ok()) out.checkpoint_fingerprint = *checkpoint;
  return out;
}

}  // namespace pdserve::engine
