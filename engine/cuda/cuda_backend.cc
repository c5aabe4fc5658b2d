// The CUDA backend's hooks (see cuda_backend.h).
#include "engine/cuda/cuda_backend.h"

#include <memory>
#include <utility>

#include "engine/cuda/cuda_model_runner.h"
#include "engine/cuda/cuda_peaks.h"
#include "engine/model/weight_source.h"

namespace pdserve::cuda {
namespace {

absl::StatusOr<std::unique_ptr<engine::ModelRunner>> Create(const engine::RunnerOptions& options) {
  if (options.weight_dtype == engine::WeightDtype::kInt4) {
    return absl::UnimplementedError(
        "--weight_dtype=int4 is not implemented by the cuda backend (4-bit weights are CPU "
        "only; the cuda backend serves the checkpoint's weights in bf16)");
  }
  absl::StatusOr<engine::ModelConfig> config = engine::ModelConfig::FromModelDir(options.model_dir);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<engine::WeightSource>> source =
      engine::WeightSource::Open(*config, options.model_dir);
  if (!source.ok()) return source.status();
  CudaRunnerOptions cuda;
  cuda.kv_block_size = options.kv_block_size;
  cuda.num_kv_blocks = engine::KvBlocksFor(options, *config, sizeof(__nv_bfloat16));
  absl::StatusOr<std::unique_ptr<CudaModelRunner>> runner = CudaModelRunner::Create(**source, cuda);
  if (!runner.ok()) return runner.status();
  return std::unique_ptr<engine::ModelRunner>(*std::move(runner));
}

absl::StatusOr<double> MeasurePeak(engine::PeakKind kind, const engine::PeakOptions& options) {
  return kind == engine::PeakKind::kFlops ? MeasureBf16GemmFlops(0, options.budget)
                                          : DeviceMemoryBandwidth(0);
}

}  // namespace

engine::BackendHooks CudaBackendHooks() {
  return {.create = &Create, .measure_peak = &MeasurePeak};
}

}  // namespace pdserve::cuda
