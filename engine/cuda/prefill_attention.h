// Causal GQA attention of one sequence's new tokens on the GPU, without a
// T x T matrix. Query row i is the token at position q_position + i; key
// (and value) row j is the token at position k_position + j, and the keys
// run to the last query (num_keys = q_position + num_tokens - k_position):
// a whole prompt has q_position = k_position = 0 and its keys are its own
// rows; a prompt chunk after cached tokens brings the cached keys gathered
// from the paged cache. Queries are taken in chunks of `query_chunk` rows;
// per chunk of queries at positions [p0, p0+c), with keys k_start..p0+c-1
// (k_start = max(0, p0 - W + 1) with a sliding window W, else 0), for each
// q head h (kv head g = h / G):
//   S_h = scale * Q_h K_g^T           cuBLAS strided-batched GEMM, fp32 out
//   P_h = masked softmax(S_h)         MaskedSoftmax, bf16 out
//   O_h = P_h V_g                     cuBLAS strided-batched GEMM, bf16 out
// batched over kv heads, one call per head of a group. The query at
// position p sees keys max(0, p - W + 1)..p, as the CPU runner.
//
// Layouts (row-major, bf16): q [num_tokens, q_heads * D] rows of q_stride,
// k and v [num_keys, kv_heads * D] rows of k_stride / v_stride (e.g. views
// into the fused qkv buffer), out [num_tokens, q_heads * D] rows of
// out_stride. In cuBLAS's column-major terms each row-major matrix is its
// own transpose: S^T = K Q^T is GemmEx(T, N, m = keys, n = rows, k = D) and
// O^T = V^T P^T is GemmEx(N, N, m = D, n = rows, k = keys).
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

struct PrefillAttentionArgs {
  const __nv_bfloat16* q = nullptr;
  int q_stride = 0;
  const __nv_bfloat16* k = nullptr;
  int k_stride = 0;
  const __nv_bfloat16* v = nullptr;
  int v_stride = 0;
  __nv_bfloat16* out = nullptr;
  int out_stride = 0;
  int num_tokens = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  int sliding_window = 0;
  // Position of query row 0 and of key row 0: k_position <= the first key
  // the first query sees (0 without a window), q_position >= k_position.
  int q_position = 0;
  int k_position = 0;
  int query_chunk = 256;
  void* workspace = nullptr;  // PrefillAttentionWorkspaceBytes(...) bytes, device memory
  size_t workspace_bytes = 0;
};

// Scratch for scores and probabilities of one chunk of queries over
// num_keys keys (q_position + num_tokens - k_position).
size_t PrefillAttentionWorkspaceBytes(int num_tokens, int q_heads, int query_chunk, int num_keys);

// Enqueues the attention on `stream` (set on `handle` for the call).
// INVALID_ARGUMENT for inconsistent shapes or a short workspace; CUDA and
// cuBLAS errors as cuda_status.h.
absl::Status PrefillAttention(cublasHandle_t handle, cudaStream_t stream,
                              const PrefillAttentionArgs& args);

}  // namespace pdserve::cuda
