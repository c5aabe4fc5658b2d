// CreateModelRunner: reads a Hugging Face model directory (config.json,
// generation_config.json when present, model.safetensors or a sharded
// index) and builds the runner of the requested backend.
#include "engine/runner_factory.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_model_runner.h"
#include "engine/model/config.h"
#include "engine/model/weight_source.h"

namespace pdserve::engine {

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(const RunnerOptions& options) {
  if (options.backend != "cpu") {
    if (options.backend == "cuda") {
      // The CUDA runner hooks in here once it exists (PDSERVE_ENABLE_CUDA builds).
      return absl::InvalidArgumentError("cuda backend not built");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend \"", options.backend, "\" (expected \"cpu\" or \"cuda\")"));
  }
  if (options.kv_block_size < 1 || options.num_kv_blocks < 0 || options.kv_cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("runner options: kv_block_size must be >= 1 (got ", options.kv_block_size,
                     "), num_kv_blocks and kv_cache_bytes >= 0 (got ", options.num_kv_blocks, ", ",
                     options.kv_cache_bytes, ")"));
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
  cpu.num_kv_blocks = options.num_kv_blocks;
  if (cpu.num_kv_blocks == 0) {
    // fp32 KV: bytes per block = block_size * 2 * layers * kv_heads * head_dim * 4.
    const int64_t block_bytes = config->KvBytesPerToken(sizeof(float)) * options.kv_block_size;
    const int64_t blocks = options.kv_cache_bytes / std::max<int64_t>(block_bytes, 1);
    cpu.num_kv_blocks = static_cast<int>(std::clamp<int64_t>(
        blocks, 1, std::numeric_limits<int32_t>::max() / options.kv_block_size));
  }
  absl::StatusOr<std::unique_ptr<CpuModelRunner>> runner = CpuModelRunner::Create(**weights, cpu);
  if (!runner.ok()) return runner.status();
  return std::unique_ptr<ModelRunner>(std::move(*runner));
}

}  // namespace pdserve::engine
