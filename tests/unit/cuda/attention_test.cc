// Attention on the device against the CPU runner's math (cpu::Dot,
// cpu::Softmax, cpu::Axpy over the visible keys): paged split-K decode
// attention through block tables, and chunked prefill attention over cuBLAS
// with the causal mask (a whole prompt, and a chunk after cached keys), both
// with and without a sliding window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "engine/cpu/kernels.h"
#include "engine/cuda/decode_attention.cuh"
#include "engine/cuda/prefill_attention.h"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16;
using testing::Nmse;
using testing::RandomFloats;
using testing::RoundToBf16;
using testing::ToBf16;

// Attention outputs are bf16 and, for prefill, pass through bf16
// probabilities: two roundings.
constexpr double kNmseAttention = 6e-5;

using AttentionTest = testing::GpuStreamTest;

int FirstVisible(int position, int window) {
  return window > 0 && position >= window ? position - window + 1 : 0;
}

// One query head over keys first..p given as row pointers, as the CPU
// runner computes it.
void CpuAttention(const float* q, const std::vector<const float*>& keys,
                  const std::vector<const float*>& values, int head_dim, float scale, float* out) {
  std::vector<float> scores(keys.size());
  for (size_t j = 0; j < keys.size(); ++j) {
    scores[j] = engine::cpu::Dot(q, keys[j], head_dim) * scale;
  }
  engine::cpu::Softmax(scores.data(), static_cast<int>(scores.size()));
  std::fill(out, out + head_dim, 0.0f);
  for (size_t j = 0; j < keys.size(); ++j) engine::cpu::Axpy(scores[j], values[j], out, head_dim);
}

struct DecodeCase {
  int partition_size;
  int sliding_window;
  bool bf16_q;
};

TEST_F(AttentionTest, PagedDecodeMatchesCpu) {
  constexpr int kQHeads = 8, kKvHeads = 2, kHeadDim = 64, kBlockSize = 8, kBlocks = 48;
  constexpr int kKv = kKvHeads * kHeadDim, kQ = kQHeads * kHeadDim, kTableStride = 24;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const std::vector<int32_t> positions = {5, 70, 150};
  const int batch = static_cast<int>(positions.size());
  // Block tables: a shuffled pool of blocks, so sequences are scattered.
  std::vector<int32_t> pool(kBlocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(1));
  std::vector<int32_t> tables(batch * kTableStride, -1);
  size_t next = 0;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i * kBlockSize <= positions[b]; ++i)
      tables[b * kTableStride + i] = pool[next++];
  }
  const std::vector<float> k_cache =
      RoundToBf16(RandomFloats(kBlocks * kBlockSize * kKv, 2, -2, 2));
  const std::vector<float> v_cache = RoundToBf16(RandomFloats(kBlocks * kBlockSize * kKv, 3));
  const std::vector<float> q = RoundToBf16(RandomFloats(batch * kQ, 4, -2, 2));
  DeviceBuffer<__nv_bfloat16> d_k(ToBf16(k_cache)), d_v(ToBf16(v_cache)), d_q16(ToBf16(q));
  DeviceBuffer<float> d_q32(q);
  DeviceBuffer<int32_t> d_tables(tables), d_positions(positions);

  for (const DecodeCase& c :
       {DecodeCase{0, 0, false}, DecodeCase{32, 0, false}, DecodeCase{32, 0, true},
        DecodeCase{16, 40, true}, DecodeCase{0, 100, false}}) {
    SCOPED_TRACE(::testing::Message() << "partition " << c.partition_size << " window "
                                      << c.sliding_window << (c.bf16_q ? " bf16 q" : " f32 q"));
    std::vector<float> want(batch * kQ);
    for (int b = 0; b < batch; ++b) {
      const int p = positions[b];
      std::vector<const float*> keys, values;
      for (int t = FirstVisible(p, c.sliding_window); t <= p; ++t) {
        const int64_t slot =
            int64_t{tables[b * kTableStride + t / kBlockSize]} * kBlockSize + t % kBlockSize;
        keys.push_back(&k_cache[slot * kKv]);
        values.push_back(&v_cache[slot * kKv]);
      }
      for (int h = 0; h < kQHeads; ++h) {
        const int g = h / (kQHeads / kKvHeads);
        std::vector<const float*> kh, vh;
        for (const float* k : keys) kh.push_back(k + g * kHeadDim);
        for (const float* v : values) vh.push_back(v + g * kHeadDim);
        CpuAttention(&q[b * kQ + h * kHeadDim], kh, vh, kHeadDim, scale,
                     &want[b * kQ + h * kHeadDim]);
      }
    }
    DecodeAttentionArgs args;
    args.batch = batch;
    args.q_heads = kQHeads;
    args.kv_heads = kKvHeads;
    args.head_dim = kHeadDim;
    args.q_stride = kQ;
    args.k_cache = d_k.get();
    args.v_cache = d_v.get();
    args.block_size = kBlockSize;
    args.block_tables = d_tables.get();
    args.block_table_stride = kTableStride;
    args.positions = d_positions.get();
    args.sliding_window = c.sliding_window;
    args.scale = scale;
    args.max_context = 151;
    args.partition_size = c.partition_size;
    const size_t ws_bytes = DecodeAttentionWorkspaceBytes(args);
    EXPECT_EQ(ws_bytes > 0, c.partition_size > 0 && c.partition_size < 100);
    DeviceBuffer<unsigned char> workspace(ws_bytes);
    DeviceBuffer<__nv_bfloat16> out(batch * kQ);
    args.workspace = workspace.get();
    args.out = out.get();
    args.out_stride = kQ;
    const cudaError_t e = c.bf16_q ? DecodeAttention(d_q16.get(), args, stream_)
                                   : DecodeAttention(d_q32.get(), args, stream_);
    ASSERT_EQ(e, cudaSuccess);
    Sync();
    EXPECT_LT(Nmse(FromBf16(out.Download()), want), kNmseAttention);
  }
}

TEST_F(AttentionTest, DecodeRejectsInconsistentHeads) {
  DecodeAttentionArgs args;
  args.batch = 1;
  args.q_heads = 6;
  args.kv_heads = 4;
  args.head_dim = 64;
  args.block_size = 16;
  args.max_context = 10;
  EXPECT_EQ(DecodeAttention(static_cast<const float*>(nullptr), args, stream_),
            cudaErrorInvalidValue);
}

struct PrefillCase {
  int query_chunk;
  int sliding_window;
};

TEST_F(AttentionTest, ChunkedPrefillMatchesCpu) {
  constexpr int kTokens = 37, kQHeads = 4, kKvHeads = 2, kHeadDim = 32;
  constexpr int kQ = kQHeads * kHeadDim, kKv = kKvHeads * kHeadDim, kStride = kQ + 2 * kKv;
  constexpr int kOutStride = kQ + 16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const std::vector<float> qkv = RoundToBf16(RandomFloats(kTokens * kStride, 5, -2, 2));
  DeviceBuffer<__nv_bfloat16> d_qkv(ToBf16(qkv));
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);

  for (const PrefillCase& c :
       {PrefillCase{8, 0}, PrefillCase{64, 0}, PrefillCase{5, 10}, PrefillCase{16, 3}}) {
    SCOPED_TRACE(::testing::Message()
                 << "chunk " << c.query_chunk << " window " << c.sliding_window);
    std::vector<float> want(kTokens * kOutStride, 0.0f);
    for (int t = 0; t < kTokens; ++t) {
      for (int h = 0; h < kQHeads; ++h) {
        const int g = h / (kQHeads / kKvHeads);
        std::vector<const float*> keys, values;
        for (int j = FirstVisible(t, c.sliding_window); j <= t; ++j) {
          keys.push_back(&qkv[j * kStride + kQ + g * kHeadDim]);
          values.push_back(&qkv[j * kStride + kQ + kKv + g * kHeadDim]);
        }
        CpuAttention(&qkv[t * kStride + h * kHeadDim], keys, values, kHeadDim, scale,
                     &want[t * kOutStride + h * kHeadDim]);
      }
    }
    PrefillAttentionArgs args;
    args.q = d_qkv.get();
    args.q_stride = kStride;
    args.k = d_qkv.get() + kQ;
    args.k_stride = kStride;
    args.v = d_qkv.get() + kQ + kKv;
    args.v_stride = kStride;
    DeviceBuffer<__nv_bfloat16> out(kTokens * kOutStride);
    args.out = out.get();
    args.out_stride = kOutStride;
    args.num_tokens = kTokens;
    args.q_heads = kQHeads;
    args.kv_heads = kKvHeads;
    args.head_dim = kHeadDim;
    args.scale = scale;
    args.sliding_window = c.sliding_window;
    args.query_chunk = c.query_chunk;
    const size_t ws_bytes =
        PrefillAttentionWorkspaceBytes(kTokens, kQHeads, c.query_chunk, kTokens);
    // Scores of one chunk, never of the whole prompt.
    EXPECT_LE(ws_bytes, size_t{kQHeads} * std::min(kTokens, c.query_chunk) * kTokens * 6 + 256);
    DeviceBuffer<unsigned char> workspace(ws_bytes);
    args.workspace = workspace.get();
    args.workspace_bytes = ws_bytes - 1;
    EXPECT_EQ(PrefillAttention(handle, stream_, args).code(), absl::StatusCode::kInvalidArgument);
    args.workspace_bytes = ws_bytes;
    ASSERT_TRUE(PrefillAttention(handle, stream_, args).ok());
    Sync();
    std::vector<float> got = FromBf16(out.Download());
    // Padding columns of the output are never written.
    for (int t = 0; t < kTokens; ++t) {
      for (int i = kQ; i < kOutStride; ++i) {
        ASSERT_TRUE(std::isnan(got[t * kOutStride + i]));
        got[t * kOutStride + i] = 0.0f;
      }
    }
    EXPECT_LT(Nmse(got, want), kNmseAttention);

    // The same prompt as a chunk after `cached` tokens whose keys start at
    // k_position (as the runner gathers them from the cache): rows cached..
    // of the whole prompt's answer.
    constexpr int kCached = 13;
    const int k_position = FirstVisible(kCached, c.sliding_window);
    PrefillAttentionArgs chunk = args;
    chunk.q = d_qkv.get() + kCached * kStride;
    chunk.k = d_qkv.get() + k_position * kStride + kQ;
    chunk.v = d_qkv.get() + k_position * kStride + kQ + kKv;
    chunk.num_tokens = kTokens - kCached;
    chunk.q_position = kCached;
    chunk.k_position = k_position;
    const size_t chunk_ws = PrefillAttentionWorkspaceBytes(chunk.num_tokens, kQHeads, c.query_chunk,
                                                           kTokens - k_position);
    DeviceBuffer<unsigned char> chunk_workspace(chunk_ws);
    chunk.workspace = chunk_workspace.get();
    chunk.workspace_bytes = chunk_ws;
    out.Poison();
    chunk.k_position = k_position + 1;  // keys that miss the first query's first key
    EXPECT_EQ(PrefillAttention(handle, stream_, chunk).code(), absl::StatusCode::kInvalidArgument);
    chunk.k_position = k_position;
    ASSERT_TRUE(PrefillAttention(handle, stream_, chunk).ok());
    Sync();
    const std::vector<float> chunk_out = FromBf16(out.Download());
    std::vector<float> got_rows, want_rows;
    for (int t = kCached; t < kTokens; ++t) {
      got_rows.insert(got_rows.end(), chunk_out.begin() + (t - kCached) * kOutStride,
                      chunk_out.begin() + (t - kCached) * kOutStride + kQ);
      want_rows.insert(want_rows.end(), want.begin() + t * kOutStride,
                       want.begin() + t * kOutStride + kQ);
    }
    EXPECT_LT(Nmse(got_rows, want_rows), kNmseAttention);
  }
  EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
}  // namespace pdserve::cuda
