// Creates a ModelRunner for a Hugging Face model directory on a backend.
//
// Backends: "cpu" (always), "cuda" in CUDA builds (PDSERVE_ENABLE_CUDA), and
// any backend registered with RegisterBackend: the CUDA backend compiled
// against the CPU emulation registers itself under "cuda" in test binaries
// only (engine/cuda/register_emulated_backend.cc); shipped binaries never
// carry the emulation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/device_peaks.h"
#include "engine/model/config.h"
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

// One line for start-up logs: the model (directory, architecture, size),
// the backend, weight storage, threads and KV capacity of `runner`, created
// from `options`.
std::string DescribeRunner(const ModelRunner& runner, const RunnerOptions& options);

// What a worker serves, as the router's registration compares it with its
// own model (router/worker_registry.h: ModelReference).
struct ServedModel {
  uint64_t config_fingerprint = 0;      // ConfigFingerprint
  uint64_t checkpoint_fingerprint = 0;  // CheckpointFingerprint; 0 if it cannot be read
  std::string weight_dtype;             // WeightDtypeName(options.weight_dtype)
  std::string kv_dtype;                 // KvDtypeName
  std::string kv_layout;                // kKvLayoutPagedNhd
  std::string backend;
};
ServedModel DescribeServedModel(const ModelRunner& runner, const RunnerOptions& options);

// options.num_kv_blocks, or as many blocks as kv_cache_bytes holds at
// `bytes_per_element` (at least 1, at most what int32 slot ids address).
inline int KvBlocksFor(const RunnerOptions& options, const ModelConfig& config,
                       int bytes_per_element) {
  if (options.num_kv_blocks > 0) return options.num_kv_blocks;
  const int64_t block_bytes = config.KvBytesPerToken(bytes_per_element) * options.kv_block_size;
  const int64_t blocks = options.kv_cache_bytes / std::max<int64_t>(block_bytes, 1);
  return static_cast<int>(std::clamp<int64_t>(
      blocks, 1, std::numeric_limits<int32_t>::max() / std::max(options.kv_block_size, 1)));
}

// A backend built outside pdserve_engine: how it creates runners (options
// already checked: kv_block_size >= 1, num_kv_blocks and kv_cache_bytes
// >= 0) and measures its device's peaks (engine/device_peaks.h).
struct BackendHooks {
  absl::StatusOr<std::unique_ptr<ModelRunner>> (*create)(const RunnerOptions& options) = nullptr;
  absl::StatusOr<double> (*measure_peak)(PeakKind kind, const PeakOptions& options) = nullptr;
};
// Registers `hooks` under `name` (replacing an earlier registration), e.g.
// from a static initializer. Thread-safe.
void RegisterBackend(const std::string& name, BackendHooks hooks);
// The hooks of a registered or built-in non-CPU backend; null if none.
const BackendHooks* FindBackend(std::string_view name);

}  // namespace pdserve::engine
