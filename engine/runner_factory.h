// Creates a ModelRunner for a Hugging Face model directory on a backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/weight_dtype.h"

namespace pdserve::engine {

struct RunnerOptions {
  std::string model_dir;        // config.json + model.safetensors (or shards + index)
  std::string backend = "cpu";  // "cpu" (and "cuda" in CUDA builds)
  int kv_block_size = 16;       // tokens per KV block
  // KV blocks to allocate; 0 derives it from kv_cache_bytes.
  int num_kv_blocks = 0;
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int num_threads = 0;  // 0: all cores
  // How weight matrices are stored in memory (CpuRunnerOptions::weight_dtype).
  WeightDtype weight_dtype = WeightDtype::kAuto;
};

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(const RunnerOptions& options);

}  // namespace pdserve::engine
