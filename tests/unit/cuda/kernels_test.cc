// The element-wise and normalisation kernels of engine/cuda against the CPU
// reference (engine/cpu/kernels.h, the CPU runner's layouts) on fresh random
// inputs, outputs poisoned before each run, with normalised-error bounds per
// output dtype. Work runs on a non-blocking stream, so a missing
// synchronisation would read poison.
#include "engine/cpu/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/cuda/bias_add.cuh"
#include "engine/cuda/convert.cuh"
#include "engine/cuda/embedding.cuh"
#include "engine/cuda/head_norm.cuh"
#include "engine/cuda/kv_cache.cuh"
#include "engine/cuda/rms_norm.cuh"
#include "engine/cuda/rope.cuh"
#include "engine/cuda/silu_mul.cuh"
#include "engine/model/config.h"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16;
using testing::kNmseBf16;
using testing::kNmseF32;
using testing::Nmse;
using testing::RandomFloats;
using testing::RoundToBf16;
using testing::ToBf16;

using KernelsTest = testing::GpuStreamTest;

// Bit-level round-to-nearest-even fp32 -> bf16, independent of the headers.
uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

TEST_F(KernelsTest, ConvertRoundsToNearestEven) {
  std::vector<float> in = RandomFloats(5000, 1, -1e3f, 1e3f);
  // Ties both ways, NaN, infinities, subnormals, the largest finite values.
  const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7fc00000u, 0x7f800000u, 0xff800000u,
                               0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x00000000u, 0x80000000u};
  for (size_t i = 0; i < std::size(specials); ++i) std::memcpy(&in[i], &specials[i], 4);
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<__nv_bfloat16> out(in.size());
  ASSERT_EQ(ConvertF32ToBf16(d_in.get(), out.get(), static_cast<int64_t>(in.size()), stream_),
            cudaSuccess);
  Sync();
  const std::vector<__nv_bfloat16> got = out.Download();
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(__bfloat16_as_ushort(got[i]), Bf16Bits(in[i])) << i << ": " << in[i];
  }

  // fp16 -> bf16: every finite fp16 value, through its exact fp32 value.
  std::vector<__half> halves;
  std::vector<float> exact;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const int exponent = static_cast<int>(bits >> 10 & 0x1f), mantissa = bits & 0x3ff;
    if (exponent == 0x1f) continue;
    const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
                                          : std::ldexp(1.0f + mantissa / 1024.0f, exponent - 15);
    halves.push_back(__ushort_as_half(static_cast<unsigned short>(bits)));
    exact.push_back(bits & 0x8000u ? -magnitude : magnitude);
  }
  DeviceBuffer<__half> d_half(halves);
  DeviceBuffer<__nv_bfloat16> out16(halves.size());
  ASSERT_EQ(
      ConvertF16ToBf16(d_half.get(), out16.get(), static_cast<int64_t>(halves.size()), stream_),
      cudaSuccess);
  Sync();
  const std::vector<__nv_bfloat16> got16 = out16.Download();
  for (size_t i = 0; i < halves.size(); ++i) {
    ASSERT_EQ(__bfloat16_as_ushort(got16[i]), Bf16Bits(exact[i])) << exact[i];
  }
}

TEST_F(KernelsTest, EmbeddingGatherCopiesRows) {
  constexpr int kVocab = 50, kHidden = 96;
  const std::vector<float> table = RoundToBf16(RandomFloats(kVocab * kHidden, 2));
  const std::vector<int32_t> tokens = {3, 0, 49, 3, 17, -1};
  DeviceBuffer<__nv_bfloat16> d_table(ToBf16(table));
  DeviceBuffer<int32_t> d_tokens(tokens);
  DeviceBuffer<float> out(tokens.size() * kHidden);
  ASSERT_EQ(EmbeddingGather(d_table.get(), kVocab, kHidden, d_tokens.get(),
                            static_cast<int>(tokens.size()), out.get(), stream_),
            cudaSuccess);
  Sync();
  const std::vector<float> got = out.Download();
  for (size_t t = 0; t + 1 < tokens.size(); ++t) {
    for (int i = 0; i < kHidden; ++i)
      ASSERT_EQ(got[t * kHidden + i], table[tokens[t] * kHidden + i]);
  }
  for (int i = 0; i < kHidden; ++i) ASSERT_TRUE(std::isnan(got[(tokens.size() - 1) * kHidden + i]));
}

TEST_F(KernelsTest, FusedAddRmsNormMatchesCpu) {
  constexpr int kRows = 7, kDim = 384;
  constexpr float kEps = 1e-5f;
  const std::vector<float> x = RandomFloats(kRows * kDim, 3, -4, 4);
  const std::vector<float> delta = RandomFloats(kRows * kDim, 4, -2, 2);
  const std::vector<float> weight = RoundToBf16(RandomFloats(kDim, 5, 0.5f, 1.5f));
  DeviceBuffer<float> d_x(x), d_delta(delta);
  DeviceBuffer<__nv_bfloat16> d_w(ToBf16(weight)), out(kRows * kDim);
  ASSERT_EQ(
      FusedAddRmsNorm(d_x.get(), d_delta.get(), d_w.get(), kRows, kDim, kEps, out.get(), stream_),
      cudaSuccess);
  Sync();
  std::vector<float> sum(x.size()), want(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + delta[i];
  engine::cpu::RmsNorm(sum.data(), weight.data(), want.data(), kRows, kDim, kEps, 1);
  EXPECT_LT(Nmse(d_x.Download(), sum), kNmseF32);  // residual updated in place
  EXPECT_LT(Nmse(FromBf16(out.Download()), want), kNmseBf16);

  // Without delta, and gathering rows (the final norm of chosen rows).
  const std::vector<int32_t> rows = {6, 0, 3};
  DeviceBuffer<int32_t> d_rows(rows);
  DeviceBuffer<__nv_bfloat16> picked(rows.size() * kDim);
  ASSERT_EQ(RmsNormGather(d_x.get(), d_rows.get(), d_w.get(), static_cast<int>(rows.size()), kDim,
                          kEps, picked.get(), stream_),
            cudaSuccess);
  Sync();
  std::vector<float> want_rows;
  for (int r : rows)
    want_rows.insert(want_rows.end(), want.begin() + r * kDim, want.begin() + (r + 1) * kDim);
  EXPECT_LT(Nmse(FromBf16(picked.Download()), want_rows), kNmseBf16);

  // With delta and gathering: only the named rows are added to and normed.
  DeviceBuffer<float> d_x2(x);
  picked.Poison();
  ASSERT_EQ(FusedAddRmsNormGather(d_x2.get(), d_delta.get(), d_rows.get(), d_w.get(),
                                  static_cast<int>(rows.size()), kDim, kEps, picked.get(), stream_),
            cudaSuccess);
  Sync();
  EXPECT_LT(Nmse(FromBf16(picked.Download()), want_rows), kNmseBf16);
  const std::vector<float> x2 = d_x2.Download();
  for (int r = 0; r < kRows; ++r) {
    const bool named = std::find(rows.begin(), rows.end(), r) != rows.end();
    for (int i = 0; i < kDim; ++i) {
      ASSERT_EQ(x2[r * kDim + i], named ? sum[r * kDim + i] : x[r * kDim + i]) << r;
    }
  }
}

// Fused qkv rows as the CPU runner holds them: q heads, k heads, v heads,
// plus padding so the row stride is wider than the data.
struct QkvShape {
  int rows = 5, q_heads = 4, kv_heads = 2, head_dim = 64;
  int q() const { return q_heads * head_dim; }
  int kv() const { return kv_heads * head_dim; }
  int stride() const { return q() + 2 * kv() + 8; }
};

TEST_F(KernelsTest, HeadRmsNormMatchesCpuForFp32AndBf16) {
  for (int head_dim : {64, 24}) {  // 24: not a multiple of the warp (tiny Qwen3 models)
    SCOPED_TRACE(head_dim);
    QkvShape s;
    s.head_dim = head_dim;
    constexpr float kEps = 1e-6f;
    const std::vector<float> qkv = RoundToBf16(RandomFloats(s.rows * s.stride(), 6, -3, 3));
    const std::vector<float> qw = RoundToBf16(RandomFloats(s.head_dim, 7, 0.5f, 1.5f));
    const std::vector<float> kw = RoundToBf16(RandomFloats(s.head_dim, 8, 0.5f, 1.5f));
    std::vector<float> want = qkv;
    for (int r = 0; r < s.rows; ++r) {
      float* row = &want[r * s.stride()];
      engine::cpu::RmsNorm(row, qw.data(), row, s.q_heads, s.head_dim, kEps, 1);
      engine::cpu::RmsNorm(row + s.q(), kw.data(), row + s.q(), s.kv_heads, s.head_dim, kEps, 1);
    }
    DeviceBuffer<__nv_bfloat16> d_qw(ToBf16(qw)), d_kw(ToBf16(kw));
    HeadNormArgs args;
    args.rows = s.rows;
    args.row_stride = s.stride();
    args.q_heads = s.q_heads;
    args.kv_heads = s.kv_heads;
    args.head_dim = s.head_dim;
    args.q_weight = d_qw.get();
    args.k_weight = d_kw.get();
    args.eps = kEps;
    DeviceBuffer<float> f32(qkv);
    ASSERT_EQ(HeadRmsNorm(f32.get(), args, stream_), cudaSuccess);
    Sync();
    EXPECT_LT(Nmse(f32.Download(), want), 1e-12);  // v and padding untouched, exactly
    DeviceBuffer<__nv_bfloat16> bf16(ToBf16(qkv));
    ASSERT_EQ(HeadRmsNorm(bf16.get(), args, stream_), cudaSuccess);
    Sync();
    EXPECT_LT(Nmse(FromBf16(bf16.Download()), want), kNmseBf16);
  }
}

engine::ModelConfig RopeConfig(bool llama3) {
  engine::ModelConfig c;
  c.head_dim = 64;
  c.rope_theta = 500000.0f;
  if (llama3) {
    c.rope_scaling.type = engine::RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 32.0f;
    c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 4.0f;
    c.rope_scaling.original_max_position_embeddings = 8192;
  }
  return c;
}

TEST_F(KernelsTest, RopeMatchesCpuWithDefaultAndLlama3Frequencies) {
  const QkvShape s;
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 131071};
  for (bool llama3 : {false, true}) {
    SCOPED_TRACE(llama3 ? "llama3" : "default");
    const std::vector<float> inv_freq = RopeConfig(llama3).RopeInverseFrequencies();
    const std::vector<float> qkv = RoundToBf16(RandomFloats(s.rows * s.stride(), 9, -2, 2));
    std::vector<float> want = qkv;
    std::vector<float> cos(s.head_dim / 2), sin(s.head_dim / 2);
    for (int r = 0; r < s.rows; ++r) {
      engine::cpu::RopeCosSin(positions[r], inv_freq.data(), s.head_dim / 2, cos.data(),
                              sin.data());
      float* row = &want[r * s.stride()];
      engine::cpu::ApplyRope(row, s.q_heads, s.head_dim, cos.data(), sin.data());
      engine::cpu::ApplyRope(row + s.q(), s.kv_heads, s.head_dim, cos.data(), sin.data());
    }
    DeviceBuffer<int32_t> d_pos(positions);
    DeviceBuffer<float> d_inv(inv_freq);
    RopeArgs args;
    args.rows = s.rows;
    args.row_stride = s.stride();
    args.positions = d_pos.get();
    args.inv_freq = d_inv.get();
    args.q_heads = s.q_heads;
    args.kv_heads = s.kv_heads;
    args.head_dim = s.head_dim;
    DeviceBuffer<float> f32(qkv);
    ASSERT_EQ(ApplyRope(f32.get(), args, stream_), cudaSuccess);
    Sync();
    EXPECT_LT(Nmse(f32.Download(), want), kNmseF32);
    DeviceBuffer<__nv_bfloat16> bf16(ToBf16(qkv));
    ASSERT_EQ(ApplyRope(bf16.get(), args, stream_), cudaSuccess);
    Sync();
    EXPECT_LT(Nmse(FromBf16(bf16.Download()), want), kNmseBf16);
  }
}

TEST_F(KernelsTest, SiluMulMatchesCpu) {
  constexpr int kRows = 3, kInter = 200;
  const std::vector<float> gu = RoundToBf16(RandomFloats(kRows * 2 * kInter, 10, -6, 6));
  std::vector<float> want(kRows * kInter);
  for (int r = 0; r < kRows; ++r) {
    engine::cpu::SwiGlu(&gu[r * 2 * kInter], &gu[r * 2 * kInter + kInter], &want[r * kInter],
                        kInter);
  }
  DeviceBuffer<float> f32(gu);
  DeviceBuffer<__nv_bfloat16> bf16(ToBf16(gu)), out(kRows * kInter);
  ASSERT_EQ(SiluMul(f32.get(), kRows, kInter, out.get(), stream_), cudaSuccess);
  Sync();
  EXPECT_LT(Nmse(FromBf16(out.Download()), want), kNmseBf16);
  out.Poison();
  ASSERT_EQ(SiluMul(bf16.get(), kRows, kInter, out.get(), stream_), cudaSuccess);
  Sync();
  EXPECT_LT(Nmse(FromBf16(out.Download()), want), kNmseBf16);
}

TEST_F(KernelsTest, AddBiasMatchesCpuAndKeepsPadding) {
  constexpr int kRows = 4, kN = 150, kStride = 160;
  const std::vector<float> y = RoundToBf16(RandomFloats(kRows * kStride, 11));
  const std::vector<float> bias = RoundToBf16(RandomFloats(kN, 12));
  std::vector<float> want = y;
  for (int r = 0; r < kRows; ++r) engine::cpu::AddBias(&want[r * kStride], bias.data(), 1, kN, 1);
  DeviceBuffer<__nv_bfloat16> d_bias(ToBf16(bias));
  DeviceBuffer<float> f32(y);
  ASSERT_EQ(AddBias(f32.get(), kRows, kN, kStride, d_bias.get(), stream_), cudaSuccess);
  Sync();
  EXPECT_EQ(f32.Download(), want);  // one fp32 addition each: exact
  DeviceBuffer<__nv_bfloat16> bf16(ToBf16(y));
  ASSERT_EQ(AddBias(bf16.get(), kRows, kN, kStride, d_bias.get(), stream_), cudaSuccess);
  Sync();
  EXPECT_LT(Nmse(FromBf16(bf16.Download()), want), kNmseBf16);
}

TEST_F(KernelsTest, KvCacheWriteFollowsBlockTables) {
  const QkvShape s;  // 5 rows: tokens of two sequences
  constexpr int kBlockSize = 4, kBlocks = 6;
  const int kv = s.kv();
  // Sequence A: tokens 0..2 in block 5; sequence B: tokens 3..4 (positions
  // 4 and 5 of a sequence whose blocks are {1, 2}); row 4 is skipped.
  const std::vector<int32_t> table_a = {5}, table_b = {1, 2};
  const std::vector<int64_t> slots = {
      KvSlot(table_a, 0, kBlockSize), KvSlot(table_a, 1, kBlockSize),
      KvSlot(table_a, 2, kBlockSize), KvSlot(table_b, 4, kBlockSize), -1};
  EXPECT_EQ(slots[3], 2 * kBlockSize + 0);
  const std::vector<float> qkv = RandomFloats(s.rows * s.stride(), 13);
  DeviceBuffer<float> d_qkv(qkv);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<__nv_bfloat16> k_cache(kBlocks * kBlockSize * kv),
      v_cache(kBlocks * kBlockSize * kv);
  KvWriteArgs args;
  args.rows = s.rows;
  args.row_stride = s.stride();
  args.k_col = s.q();
  args.v_col = s.q() + kv;
  args.kv_size = kv;
  args.slots = d_slots.get();
  args.k_cache = k_cache.get();
  args.v_cache = v_cache.get();
  ASSERT_EQ(WriteKvCache(d_qkv.get(), args, stream_), cudaSuccess);
  Sync();
  const std::vector<__nv_bfloat16> k = k_cache.Download(), v = v_cache.Download();
  std::vector<bool> written(kBlocks * kBlockSize, false);
  for (int r = 0; r < 4; ++r) {
    written[slots[r]] = true;
    for (int j = 0; j < kv; ++j) {
      ASSERT_EQ(__bfloat16_as_ushort(k[slots[r] * kv + j]),
                Bf16Bits(qkv[r * s.stride() + s.q() + j]));
      ASSERT_EQ(__bfloat16_as_ushort(v[slots[r] * kv + j]),
                Bf16Bits(qkv[r * s.stride() + s.q() + kv + j]));
    }
  }
  for (int slot = 0; slot < kBlocks * kBlockSize; ++slot) {
    if (written[slot]) continue;
    for (int j = 0; j < kv; ++j) ASSERT_EQ(__bfloat16_as_ushort(k[slot * kv + j]), 0xffff) << slot;
  }
}

TEST_F(KernelsTest, KvGatherAndScatterFollowBlockTables) {
  constexpr int kBlockSize = 4, kBlocks = 8, kKv = 40;
  const std::vector<int32_t> table = {6, 1, 4};  // tokens 0..11
  constexpr int kFirst = 3, kCount = 7;          // tokens 3..9: three blocks
  const std::vector<float> cache_k = RoundToBf16(RandomFloats(kBlocks * kBlockSize * kKv, 21));
  const std::vector<float> cache_v = RoundToBf16(RandomFloats(kBlocks * kBlockSize * kKv, 22));
  DeviceBuffer<__nv_bfloat16> k_cache(ToBf16(cache_k)), v_cache(ToBf16(cache_v));
  DeviceBuffer<int32_t> d_table(table);
  DeviceBuffer<__nv_bfloat16> k(kCount * kKv), v(kCount * kKv);
  KvCopyArgs args;
  args.k_cache = k_cache.get();
  args.v_cache = v_cache.get();
  args.block_size = kBlockSize;
  args.kv_size = kKv;
  args.block_table = d_table.get();
  args.first = kFirst;
  args.count = kCount;
  args.k = k.get();
  args.v = v.get();
  ASSERT_EQ(GatherKv(args, stream_), cudaSuccess);
  Sync();
  const std::vector<float> got_k = FromBf16(k.Download()), got_v = FromBf16(v.Download());
  for (int t = 0; t < kCount; ++t) {
    const int64_t slot = KvSlot(table, kFirst + t, kBlockSize);
    for (int j = 0; j < kKv; ++j) {
      ASSERT_EQ(got_k[t * kKv + j], cache_k[slot * kKv + j]) << t;
      ASSERT_EQ(got_v[t * kKv + j], cache_v[slot * kKv + j]) << t;
    }
  }

  // Scatter fresh values back into the same slots of a poisoned cache:
  // exactly those slots change.
  const std::vector<float> new_k = RoundToBf16(RandomFloats(kCount * kKv, 23));
  const std::vector<float> new_v = RoundToBf16(RandomFloats(kCount * kKv, 24));
  k.Upload(ToBf16(new_k));
  v.Upload(ToBf16(new_v));
  k_cache.Poison();
  v_cache.Poison();
  ASSERT_EQ(ScatterKv(args, stream_), cudaSuccess);
  Sync();
  const std::vector<float> after_k = FromBf16(k_cache.Download());
  const std::vector<float> after_v = FromBf16(v_cache.Download());
  std::vector<bool> written(kBlocks * kBlockSize, false);
  for (int t = 0; t < kCount; ++t) {
    const int64_t slot = KvSlot(table, kFirst + t, kBlockSize);
    written[slot] = true;
    for (int j = 0; j < kKv; ++j) {
      ASSERT_EQ(after_k[slot * kKv + j], new_k[t * kKv + j]);
      ASSERT_EQ(after_v[slot * kKv + j], new_v[t * kKv + j]);
    }
  }
  for (int slot = 0; slot < kBlocks * kBlockSize; ++slot) {
    if (written[slot]) continue;
    ASSERT_TRUE(std::isnan(after_k[slot * kKv]) && std::isnan(after_v[slot * kKv])) << slot;
  }
}

}  // namespace
}  // namespace pdserve::cuda
