// Paged decode attention for GQA, one query token per sequence:
//   out[b, h, :] = sum_j softmax_j(scale * q[b, h] . K[j]) V[j]
// over the keys j of sequence b visible from its position p = positions[b]:
// first..p with first = max(0, p - sliding_window + 1) (0: no window), the
// CPU runner's FirstVisible. Query head h reads kv head h / (q_heads /
// kv_heads). K and V come from the paged cache (kv_cache.cuh layout) through
// block_tables[b * block_table_stride + j / block_size].
//
// The visible range is cut into partitions of partition_size keys, one
// thread block per (kv head, sequence, partition); each block keeps its
// kv head's q heads together, so K and V are read once per group. With more
// than one partition a combine kernel merges the partial softmaxes
// (split-K, flash-decoding style) through `workspace`.
// q: [batch, q_heads * head_dim] rows at q + b * q_stride (fp32 or bf16);
// out: bf16 rows at out + b * out_stride.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

struct DecodeAttentionArgs {
  int batch = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int q_stride = 0;
  const __nv_bfloat16* k_cache = nullptr;
  const __nv_bfloat16* v_cache = nullptr;
  int block_size = 0;
  const int32_t* block_tables = nullptr;
  int block_table_stride = 0;
  const int32_t* positions = nullptr;  // [batch]
  int sliding_window = 0;
  float scale = 1.0f;
  // An upper bound of positions[b] + 1 over the batch (sizes the grid).
  int max_context = 0;
  // Keys per partition; 0 picks the default. Shrunk to fit shared memory.
  int partition_size = 0;
  void* workspace = nullptr;  // DecodeAttentionWorkspaceBytes(args) bytes
  __nv_bfloat16* out = nullptr;
  int out_stride = 0;
};

// Workspace the partial results of `args` need (0 when one partition covers
// every sequence).
size_t DecodeAttentionWorkspaceBytes(const DecodeAttentionArgs& args);

cudaError_t DecodeAttention(const float* q, const DecodeAttentionArgs& args, cudaStream_t stream);
cudaError_t DecodeAttention(const __nv_bfloat16* q, const DecodeAttentionArgs& args,
                            cudaStream_t stream);

}  // namespace pdserve::cuda
