// Causal GQA attention over one prompt on the GPU, without a T x T matrix:
// queries are taken in chunks of `query_chunk` rows; per chunk [q0, q0+c),
// with keys k_start..q0+c-1 (k_start = max(0, q0 - W + 1) with a sliding
// window W, else 0), for each q head h (kv head g = h / G):
//   S_h = scale * Q_h K_g^T           cuBLAS strided-batched GEMM, fp32 out
//   P_h = masked softmax(S_h)         MaskedSoftmax, bf16 out
//   O_h = P_h V_g                     cuBLAS strided-batched GEMM, bf16 out
// batched over kv heads, one call per head of a group. The query at
// position p sees keys max(0, p - W + 1)..p, as the CPU runner.
//
// Layouts (row-major, bf16): q [T, q_heads * D] rows of q_stride, k and v
// [T, kv_heads * D] rows of k_stride / v_stride (e.g. views into the fused
// qkv buffer), out [T, q_heads * D] rows of out_stride. In cuBLAS's
// column-major terms each row-major matrix is its own transpose: S^T = K Q^T
// is GemmEx(T, N, m = keys, n = rows, k = D) and O^T = V^T P^T is
// GemmEx(N, N, m = D, n = rows, k = keys).
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "engine/cuda/cuda_compat.h"

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
  int query_chunk = 256;
  void* workspace = nullptr;  // PrefillAttentionWorkspaceBytes(...) bytes, device memory
  size_t workspace_bytes = 0;
};

// Scratch for scores and probabilities of one chunk.
size_t PrefillAttentionWorkspaceBytes(int num_tokens, int q_heads, int query_chunk);

// Enqueues the attention on `stream` (set on `handle` for the call).
// INVALID_ARGUMENT for inconsistent shapes or a short workspace; CUDA and
// cuBLAS errors as cuda_status.h.
absl::Status PrefillAttention(cublasHandle_t handle, cudaStream_t stream,
                              const PrefillAttentionArgs& args);

}  // namespace pdserve::cuda
