// Qwen3's per-head RMSNorm of q and k, in place, before RoPE:
//   q[r, h, :] = RMSNorm(q[r, h, :]) * q_weight   for h < q_heads
//   k[r, g, :] = RMSNorm(k[r, g, :]) * k_weight   for g < kv_heads
// over rows of the fused qkv buffer: row r holds q (q_heads * head_dim)
// then k (kv_heads * head_dim) from qkv + r * row_stride; weights [head_dim]
// bf16. T is float or bf16 (computed in fp32, stored as T).
#pragma once

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

struct HeadNormArgs {
  int rows = 0;
  int row_stride = 0;  // elements between rows
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;  // <= 512 (any size: Qwen3 tests use 24)
  const __nv_bfloat16* q_weight = nullptr;
  const __nv_bfloat16* k_weight = nullptr;
  float eps = 1e-6f;
};

cudaError_t HeadRmsNorm(float* qkv, const HeadNormArgs& args, cudaStream_t stream);
cudaError_t HeadRmsNorm(__nv_bfloat16* qkv, const HeadNormArgs& args, cudaStream_t stream);

}  // namespace pdserve::cuda
