// The backend registry: how a runner is asked for (RunnerOptions) and the
// hooks a backend built outside the engine's own target registers under its
// name (the CUDA backend: built into pdserve_engine in CUDA builds, or
// registered by engine/cuda/register_emulated_backend.cc in test binaries
// that run it under the CPU emulation). Here, below every backend, so that a
// backend depends on the runtime and never on the factory that looks it up
// (engine/runner_factory.h, engine/device_peaks.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/model/config.h"
#include "engine/runtime/model_runner.h"
#include "engine/types/weight_dtype.h"

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

enum class PeakKind { kFlops, kMemoryBandwidth };

struct PeakOptions {
  std::string backend = "cpu";                      // as RunnerOptions::backend
  int threads = 0;                                  // compute threads of the runner; 0: all cores
  absl::Duration budget = absl::Milliseconds(150);  // per measurement
};

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
// The hooks registered under `name`; null if none. (engine::FindBackend in
// engine/runner_factory.h also knows the backends built into the engine.)
const BackendHooks* FindRegisteredBackend(std::string_view name);

}  // namespace pdserve::engine
