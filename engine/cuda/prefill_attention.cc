// Chunked prefill attention over cuBLAS (see prefill_attention.h).
#include "engine/cuda/prefill_attention.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "engine/cuda/base/cuda_status.h"
#include "engine/cuda/masked_softmax.cuh"

namespace pdserve::cuda {

namespace {

// Scores of every head for the largest chunk, and where the probabilities
// start after them (256-byte aligned).
size_t ChunkElements(int num_tokens, int q_heads, int query_chunk, int num_keys) {
  return static_cast<size_t>(q_heads) * static_cast<size_t>(std::min(num_tokens, query_chunk)) *
         static_cast<size_t>(num_keys);
}

// First key a query at position p sees (the CPU runner's FirstVisible).
int FirstVisible(int p, int window) { return window > 0 && p >= window ? p - window + 1 : 0; }
size_t ProbsOffset(size_t elements) { return (elements * sizeof(float) + 255) / 256 * 256; }

}  // namespace

size_t PrefillAttentionWorkspaceBytes(int num_tokens, int q_heads, int query_chunk, int num_keys) {
  const size_t elements = ChunkElements(num_tokens, q_heads, query_chunk, num_keys);
  return ProbsOffset(elements) + elements * sizeof(__nv_bfloat16);
}

absl::Status PrefillAttention(cublasHandle_t handle, cudaStream_t stream,
                              const PrefillAttentionArgs& a) {
  if (a.num_tokens <= 0) return absl::OkStatus();
  if (a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.head_dim <= 0 ||
      a.query_chunk <= 0 || a.q_stride < a.q_heads * a.head_dim ||
      a.k_stride < a.kv_heads * a.head_dim || a.v_stride < a.kv_heads * a.head_dim ||
      a.out_stride < a.q_heads * a.head_dim) {
    return absl::InvalidArgumentError("PrefillAttention: inconsistent head counts or strides");
  }
  if (a.k_position < 0 || a.q_position < a.k_position ||
      a.k_position > FirstVisible(a.q_position, a.sliding_window)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PrefillAttention: keys from position ", a.k_position, " do not cover queries from ",
        a.q_position, " (sliding window ", a.sliding_window, ")"));
  }
  const int num_keys = a.q_position + a.num_tokens - a.k_position;
  const size_t need =
      PrefillAttentionWorkspaceBytes(a.num_tokens, a.q_heads, a.query_chunk, num_keys);
  if (a.workspace == nullptr || a.workspace_bytes < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefillAttention: workspace of ", a.workspace_bytes, " bytes, need ", need));
  }
  PDSERVE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream));
  const int group = a.q_heads / a.kv_heads, d = a.head_dim;
  float* scores = static_cast<float*>(a.workspace);
  auto* probs = reinterpret_cast<__nv_bfloat16*>(
      static_cast<char*>(a.workspace) +
      ProbsOffset(ChunkElements(a.num_tokens, a.q_heads, a.query_chunk, num_keys)));
  const float zero = 0.0f, one = 1.0f;

  for (int q0 = 0; q0 < a.num_tokens; q0 += a.query_chunk) {
    const int rows = std::min(a.query_chunk, a.num_tokens - q0);
    const int p0 = a.q_position + q0;  // position of the chunk's first query
    const int k_start = FirstVisible(p0, a.sliding_window);
    const int keys = p0 + rows - k_start;
    const int64_t k_row = k_start - a.k_position;  // key row of position k_start
    const long long head_elems = static_cast<long long>(rows) * keys;  // one head's S or P
    for (int j = 0; j < group; ++j) {
      // S_h^T [keys x rows] = K_g [keys x D] * Q_h^T [D x rows], h = g*G + j.
      PDSERVE_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_T, CUBLAS_OP_N, keys, rows, d, &a.scale, a.k + k_row * a.k_stride,
          CUDA_R_16BF, a.k_stride, d,
          a.q + static_cast<int64_t>(q0) * a.q_stride + static_cast<int64_t>(j) * d, CUDA_R_16BF,
          a.q_stride, static_cast<long long>(group) * d, &zero, scores + j * head_elems, CUDA_R_32F,
          keys, group * head_elems, a.kv_heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    MaskedSoftmaxArgs softmax;
    softmax.scores = scores;
    softmax.probs = probs;
    softmax.heads = a.q_heads;
    softmax.rows = rows;
    softmax.cols = keys;
    softmax.q_start = p0;
    softmax.k_start = k_start;
    softmax.sliding_window = a.sliding_window;
    PDSERVE_CUDA_RETURN_IF_ERROR(MaskedSoftmax(softmax, stream));
    for (int j = 0; j < group; ++j) {
      // O_h^T [D x rows] = V_g^T [D x keys] * P_h^T [keys x rows].
      PDSERVE_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_N, CUBLAS_OP_N, d, rows, keys, &one, a.v + k_row * a.v_stride,
          CUDA_R_16BF, a.v_stride, d, probs + j * head_elems, CUDA_R_16BF, keys, group * head_elems,
          &zero, a.out + static_cast<int64_t>(q0) * a.out_stride + static_cast<int64_t>(j) * d,
          CUDA_R_16BF, a.out_stride, static_cast<long long>(group) * d, a.kv_heads,
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve::cuda
