// Creates a ModelRunner for a Hugging Face model directory on a backend.
//
// Backends: "cpu" (always), "cuda" in CUDA builds (PDSERVE_ENABLE_CUDA), and
// any backend registered with RegisterBackend (engine/runtime/
// backend_registry.h): the CUDA backend compiled against the CPU emulation
// registers itself under "cuda" in test binaries only
// (engine/cuda/register_emulated_backend.cc); shipped binaries never carry
// the emulation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/device_peaks.h"
#include "engine/model/config.h"
#include "engine/runtime/backend_registry.h"
#include "engine/runtime/model_runner.h"
#include "engine/types/weight_dtype.h"

namespace pdserve::engine {

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

// The hooks of a registered (RegisterBackend) or built-in non-CPU backend;
// null if none.
const BackendHooks* FindBackend(std::string_view name);

}  // namespace pdserve::engine
