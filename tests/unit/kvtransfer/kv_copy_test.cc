// The KV copy kernel (kvtransfer/device/kv_copy.cuh) against the host
// reference (kv_blocks.h row spans, memcpy): gathers, scatters and
// block-to-block copies between layouts with different block sizes and
// shuffled block ids, ranges that start and end inside blocks, ranges that
// need several launches, and row sizes that force narrow accesses. The
// destination is poisoned first and the work runs on a non-blocking stream.
#include "kvtransfer/device/kv_copy.cuh"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "device_test_util.h"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::kvtransfer::device {
namespace {

using KvCopyTest = cuda::testing::GpuStreamTest;
using kvtransfer::testing::DeviceKv;
using kvtransfer::testing::RandomLayers;

TransferSpec Spec(int heads, int dim, const char* dtype, int bytes, int tokens) {
  TransferSpec s = kvtransfer::testing::SmallSpec(1, tokens);
  s.num_kv_heads = heads;
  s.head_dim = dim;
  s.dtype = dtype;
  s.bytes_per_element = bytes;
  return s;
}

KvRows PagedRows(const engine::KvRegion& r, const std::vector<int32_t>& table, int first) {
  return {.k = r.k_base,
          .v = r.v_base,
          .block_stride = r.block_stride_bytes,
          .block_size = r.block_size,
          .blocks = table,
          .first_token = first};
}

struct Case {
  int heads, dim, bytes;
  int src_block, dst_block;
  int tokens, begin, count;
};

class KvCopyCases : public KvCopyTest, public ::testing::WithParamInterface<Case> {};

// Paged -> paged (CUDA IPC's copy), then paged -> staging -> paged (NCCL's
// gather and scatter): each equals the host reference byte for byte, and
// nothing outside the range is touched.
TEST_P(KvCopyCases, MatchesTheHostReference) {
  const Case c = GetParam();
  const TransferSpec spec = Spec(c.heads, c.dim, c.bytes == 2 ? "bf16" : "f32", c.bytes, c.tokens);
  const int64_t row = static_cast<int64_t>(spec.TokenBytes());
  DeviceKv src(spec, c.tokens / c.src_block + 8, c.src_block, 1);
  DeviceKv dst(spec, c.tokens / c.dst_block + 8, c.dst_block, 2);
  const std::vector<int32_t> st = src.Allocate(c.tokens);
  const std::vector<int32_t> dt = dst.Allocate(c.tokens);
  const std::vector<std::byte> payload = RandomLayers(spec, 3)[0];
  src.WriteLayer(0, st, payload);
  const std::vector<std::byte> before = dst.ReadLayer(0, dt, c.tokens);

  // The reference: rows [begin, begin + count) of K, then of V, replaced.
  std::vector<std::byte> want = before;
  for (int half = 0; half < 2; ++half) {
    const size_t at = half * c.tokens * row + c.begin * row;
    std::memcpy(want.data() + at, payload.data() + at, c.count * row);
  }

  const engine::KvRegion& sr = src.regions()[0];
  const engine::KvRegion& dr = dst.regions()[0];
  ASSERT_EQ(
      CopyKvRows(PagedRows(sr, st, c.begin), PagedRows(dr, dt, c.begin), c.count, row, stream_),
      cudaSuccess);
  Sync();
  EXPECT_TRUE(dst.ReadLayer(0, dt, c.tokens) == want) << "paged -> paged";

  // Through staging, into a fresh destination.
  DeviceKv dst2(spec, c.tokens / c.dst_block + 8, c.dst_block, 4);
  const std::vector<int32_t> dt2 = dst2.Allocate(c.tokens);
  const std::vector<std::byte> before2 = dst2.ReadLayer(0, dt2, c.tokens);
  std::vector<std::byte> want2 = before2;
  for (int half = 0; half < 2; ++half) {
    const size_t at = half * c.tokens * row + c.begin * row;
    std::memcpy(want2.data() + at, payload.data() + at, c.count * row);
  }
  std::byte* staging = nullptr;
  ASSERT_EQ(cudaMalloc(&staging, 2 * row * c.count), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(staging, 0xff, 2 * row * c.count, stream_), cudaSuccess);
  const KvRows staged{.k = staging, .v = staging + row * c.count};
  ASSERT_EQ(CopyKvRows(PagedRows(sr, st, c.begin), staged, c.count, row, stream_), cudaSuccess);
  ASSERT_EQ(CopyKvRows(staged, PagedRows(dst2.regions()[0], dt2, c.begin), c.count, row, stream_),
            cudaSuccess);
  Sync();
  // The staging holds exactly the wire layout.
  std::vector<std::byte> wire(2 * row * c.count);
  ASSERT_EQ(cudaMemcpy(wire.data(), staging, wire.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int half = 0; half < 2; ++half) {
    EXPECT_EQ(std::memcmp(wire.data() + half * c.count * row,
                          payload.data() + half * c.tokens * row + c.begin * row, c.count * row),
              0)
        << "staging half " << half;
  }
  EXPECT_TRUE(dst2.ReadLayer(0, dt2, c.tokens) == want2) << "paged -> staging -> paged";
  cudaFree(staging);
}

INSTANTIATE_TEST_SUITE_P(Layouts, KvCopyCases,
                         ::testing::Values(
                             // Whole range, 16-byte accesses, blocks of 16 -> 4.
                             Case{2, 8, 4, 16, 4, 40, 0, 40},
                             // A range starting and ending inside blocks of 5 and 3.
                             Case{2, 8, 4, 5, 3, 37, 7, 23},
                             // bf16 rows of 6 bytes: 2-byte accesses.
                             Case{1, 3, 2, 4, 7, 29, 3, 21},
                             // One-token blocks on one side: several launches (kMaxCopyBlocks).
                             Case{1, 4, 4, 1, 16, 300, 5, 290}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "Case" + std::to_string(info.index);
                         });

TEST_F(KvCopyTest, RefusesATableThatDoesNotCoverTheRange) {
  const TransferSpec spec = Spec(2, 8, "f32", 4, 16);
  DeviceKv kv(spec, 8, 4, 1);
  const std::vector<int32_t> table = kv.Allocate(8);  // 2 blocks: tokens [0, 8)
  const engine::KvRegion& r = kv.regions()[0];
  const int64_t row = static_cast<int64_t>(spec.TokenBytes());
  std::byte* staging = nullptr;
  ASSERT_EQ(cudaMalloc(&staging, 2 * row * 16), cudaSuccess);
  const KvRows staged{.k = staging, .v = staging + row * 16};
  EXPECT_EQ(CopyKvRows(PagedRows(r, table, 0), staged, 16, row, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(CopyKvRows(PagedRows(r, table, 0), staged, 8, 0, stream_), cudaErrorInvalidValue);
  Sync();
  cudaFree(staging);
}

}  // namespace
}  // namespace pdserve::kvtransfer::device
