// The decoder's weights in device memory, all bf16, in one allocation,
// loaded from a WeightSource (engine/model/weight_source.h) one tensor at a
// time through a bounded pinned staging buffer: bf16 tensors are copied as
// they are stored, f16 and f32 ones are copied in their stored dtype and
// converted on the device (convert.cuh, round to nearest even). No host
// copy of the model in another dtype is ever made; host memory used is the
// staging buffer alone (plus the checkpoint's memory map).
//
// Fused as the CPU runner fuses them (row-major, [out, in]):
//   wqkv = [q_proj; k_proj; v_proj]   [Q + 2 KV, H]   (bqkv likewise)
//   wgu  = [gate_proj; up_proj]       [2 I, H]
// Norm weights and biases are bf16 too (the kernels read them so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/base/cuda_compat.h"
#include "engine/cuda/base/device_memory.h"
#include "engine/model/weight_source.h"

namespace pdserve::cuda {

struct DeviceLayerWeights {
  const __nv_bfloat16* input_norm = nullptr;  // [H]
  const __nv_bfloat16* wqkv = nullptr;        // [Q + 2 KV, H]
  const __nv_bfloat16* bqkv = nullptr;        // [Q + 2 KV]; null: no bias
  const __nv_bfloat16* q_norm = nullptr;      // [D]; null: no q/k norm
  const __nv_bfloat16* k_norm = nullptr;      // [D]
  const __nv_bfloat16* wo = nullptr;          // [H, Q]
  const __nv_bfloat16* bo = nullptr;          // [H]; null: no bias
  const __nv_bfloat16* post_norm = nullptr;   // [H]
  const __nv_bfloat16* wgu = nullptr;         // [2 I, H]
  const __nv_bfloat16* wdown = nullptr;       // [H, I]
};

class DeviceWeights {
 public:
  // Loads every tensor of `source` on `stream` through `staging_bytes` of
  // pinned host memory (two halves, so one uploads while the next fills;
  // at least 64 bytes). Returns once the weights are on the device.
  static absl::StatusOr<DeviceWeights> Load(const engine::WeightSource& source, cudaStream_t stream,
                                            size_t staging_bytes);

  const __nv_bfloat16* embed() const { return embed_; }            // [vocab, H]
  const __nv_bfloat16* lm_head() const { return lm_head_; }        // [vocab, H]; embed() when tied
  const __nv_bfloat16* final_norm() const { return final_norm_; }  // [H]
  std::span<const DeviceLayerWeights> layers() const { return layers_; }
  // Bytes a decode step reads (ModelRunner::DecodeWeightBytes): every
  // matrix, norm and bias, and the LM head, but not the input embedding
  // unless it is the LM head.
  int64_t decode_bytes() const { return decode_bytes_; }
  size_t total_bytes() const { return storage_.size(); }

 private:
  DeviceAllocation storage_;
  const __nv_bfloat16* embed_ = nullptr;
  const __nv_bfloat16* lm_head_ = nullptr;
  const __nv_bfloat16* final_norm_ = nullptr;
  std::vector<DeviceLayerWeights> layers_;
  int64_t decode_bytes_ = 0;
};

}  // namespace pdserve::cuda
