// Copies the K and V rows of a run of tokens between two KV layouts on the
// device: the gather (paged blocks -> a contiguous staging buffer) before a
// send, the scatter (staging -> paged blocks) after a receive, and the
// direct block-to-block copy of CUDA IPC. A row is one token's K (or V):
// row_bytes = num_kv_heads * head_dim * element size, copied bit for bit.
//
// A side is either paged (block_size > 0: token t of the sequence lives in
// blocks[t / block_size], slot t % block_size, at k + block * block_stride +
// slot * row_bytes, V likewise) or contiguous (block_size == 0: K rows of the
// range from `k`, V rows from `v`, the wire and staging layout). The host
// entry point splits the range into launches whose paged sides need at most
// kMaxCopyBlocks blocks each (the block ids travel as kernel arguments), and
// picks the widest access (16 down to 1 bytes) that every address allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::kvtransfer::device {

inline constexpr int kMaxCopyBlocks = 96;

// One side of a copy, as the host describes it.
struct KvRows {
  std::byte* k = nullptr;
  std::byte* v = nullptr;
  int64_t block_stride = 0;         // paged: bytes from one block to the next
  int block_size = 0;               // paged: tokens per block; 0: contiguous rows
  std::span<const int32_t> blocks;  // paged: the sequence's blocks, from token 0
  int first_token = 0;              // paged: the range's first token in the sequence
};

// Enqueues the copy of `num_tokens` tokens' K and V rows from `src` to `dst`
// on `stream`. cudaErrorInvalidValue for a bad description (a block table
// that does not cover the range, non-positive row size).
cudaError_t CopyKvRows(const KvRows& src, const KvRows& dst, int num_tokens, int64_t row_bytes,
                       cudaStream_t stream);

}  // namespace pdserve::kvtransfer::device
