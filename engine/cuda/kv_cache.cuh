// Paged KV cache write. Per layer, K and V apart, each
// [num_blocks, block_size, kv_heads, head_dim] bf16 (the CPU runner's layout
// in bf16): token t of a sequence lives in block block_table[t / block_size],
// slot t % block_size, i.e. at flat slot
//   block_table[t / block_size] * block_size + t % block_size
// (KvSlot). Row r of the fused qkv buffer (qkv + r * row_stride) holds its
// k at column k_col and v at v_col, kv_size = kv_heads * head_dim values
// each; it is written, rounded to bf16, to flat slot slots[r] (skipped when
// negative).
#pragma once

#include <cstdint>
#include <span>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

inline int64_t KvSlot(std::span<const int32_t> block_table, int t, int block_size) {
  return int64_t{block_table[t / block_size]} * block_size + t % block_size;
}

struct KvWriteArgs {
  int rows = 0;
  int row_stride = 0;
  int k_col = 0;
  int v_col = 0;
  int kv_size = 0;
  const int64_t* slots = nullptr;  // [rows]
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
};

cudaError_t WriteKvCache(const float* qkv, const KvWriteArgs& args, cudaStream_t stream);
cudaError_t WriteKvCache(const __nv_bfloat16* qkv, const KvWriteArgs& args, cudaStream_t stream);

// Tokens first..first + count - 1 of one sequence between one layer's paged
// cache and contiguous arrays k and v, each [count, kv_size]: GatherKv
// copies out of the cache (chunked prefill reads the keys before a chunk;
// host staging of a layer), ScatterKv into it (a layer received from a
// peer). block_table (device memory) covers first + count tokens.
struct KvCopyArgs {
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
  int block_size = 0;
  int kv_size = 0;
  const int32_t* block_table = nullptr;
  int first = 0;
  int count = 0;
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
};
cudaError_t GatherKv(const KvCopyArgs& args, cudaStream_t stream);
cudaError_t ScatterKv(const KvCopyArgs& args, cudaStream_t stream);

}  // namespace pdserve::cuda
