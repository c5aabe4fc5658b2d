// Rotary position embedding with the rotate-half convention, in place on
// the q and k heads of the fused qkv buffer (row r: q_heads then kv_heads
// heads of head_dim from qkv + r * row_stride), as the CPU reference
// cpu::RopeCosSin + cpu::ApplyRope: for i < head_dim / 2,
//   angle = float(positions[r]) * inv_freq[i]     (an fp32 product)
//   (x[i], x[i+d/2]) -> (x[i] cos - x[i+d/2] sin, x[i+d/2] cos + x[i] sin)
// with cos/sin of the angle taken in double and rounded to fp32.
// inv_freq [head_dim / 2] comes from ModelConfig::RopeInverseFrequencies,
// so default and llama3-scaled RoPE are the same kernel. T is float or bf16.
#pragma once

#include <cstdint>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

struct RopeArgs {
  int rows = 0;
  int row_stride = 0;
  const int32_t* positions = nullptr;  // [rows]
  const float* inv_freq = nullptr;     // [head_dim / 2]
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;  // even
};

cudaError_t ApplyRope(float* qkv, const RopeArgs& args, cudaStream_t stream);
cudaError_t ApplyRope(__nv_bfloat16* qkv, const RopeArgs& args, cudaStream_t stream);

}  // namespace pdserve::cuda
