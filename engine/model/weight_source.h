// Decoder weights as stored in a checkpoint, for backends that load them
// straight into their own storage: every tensor of ModelWeightSpecs(config)
// as a view of its bytes in the stored dtype (F32, F16 or BF16), validated
// once (presence, shape, dtype), with the model fingerprint. A backend converts
// one tensor at a time into what it keeps (bf16 device memory, bf16 or fp32
// host matrices), so a bf16 model is never expanded to an fp32 host copy on
// the way. The views point into the memory-mapped files: valid while the
// WeightSource lives.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/safetensors.h"

namespace pdserve::engine {

struct TensorView {
  std::string name;
  StDtype dtype = StDtype::kF32;  // F32, F16 or BF16
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  std::span<const std::byte> bytes;  // little-endian, row-major

  float At(int64_t i) const;  // element i as fp32
  // Converts elements [begin, begin + out.size()) into `out`.
  void ToF32(std::span<float> out, int64_t begin = 0) const;
  // Same into bf16 bits, rounded to nearest even (a copy for BF16).
  void ToBf16(std::span<uint16_t> out, int64_t begin = 0) const;
};

// A fingerprint for weights stored differently from the checkpoint (e.g.
// quantized): `fingerprint` mixed with `tag`, so runners whose KV would
// differ do not pair.
uint64_t MixFingerprint(uint64_t fingerprint, std::string_view tag);

class WeightSource {
 public:
  // Opens `model_dir` (SafetensorsCheckpoint::Open) and checks every tensor
  // `config` needs: NOT_FOUND names a missing one, INVALID_ARGUMENT a wrong
  // shape (both shapes) or a dtype other than F32/F16/BF16.
  static absl::StatusOr<std::unique_ptr<WeightSource>> Open(const ModelConfig& config,
                                                            const std::string& model_dir);
  static absl::StatusOr<std::unique_ptr<WeightSource>> FromCheckpoint(
      const ModelConfig& config, std::unique_ptr<SafetensorsCheckpoint> checkpoint);

  const ModelConfig& config() const { return config_; }
  // One of ModelWeightSpecs(config)'s tensors; nullptr for any other name.
  const TensorView* Find(std::string_view name) const;
  // Layer `layer`'s tensor `suffix` ("self_attn.q_proj.weight"); nullptr if
  // the config has no such tensor.
  const TensorView* Layer(int layer, std::string_view suffix) const;
  // ComputeFingerprint's value for these weights (engine/model/weights.h):
  // the same whichever way the weights are loaded.
  uint64_t fingerprint() const { return fingerprint_; }
  // The checkpoint as stored, cheap to compute from the files alone: the
  // config and each tensor's name, shape and first and last 64 values
  // (a few pages per tensor). The router compares it with its workers'.
  uint64_t checkpoint_fingerprint() const { return checkpoint_fingerprint_; }

 private:
  explicit WeightSource(const ModelConfig& config) : config_(config) {}

  const ModelConfig config_;
  std::unique_ptr<SafetensorsCheckpoint> checkpoint_;  // owns the bytes the views point into
  std::vector<TensorView> tensors_;                    // ModelWeightSpecs order
  std::unordered_map<std::string, size_t> index_;
  uint64_t fingerprint_ = 0;
  uint64_t checkpoint_fingerprint_ = 0;
};

// WeightSource::Open(config, model_dir)->checkpoint_fingerprint().
absl::StatusOr<uint64_t> CheckpointFingerprint(const ModelConfig& config,
                                               const std::string& model_dir);

}  // namespace pdserve::engine
