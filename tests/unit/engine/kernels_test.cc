// CPU kernels: bf16 packing, attention's grouped dot products, the lane
// sums and the vector exp. The weight matmuls are tested in weight_matrix_test.cc.
#include "engine/cpu/kernels.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu/kernels_gemv.h"
#include "engine/cpu/lane_sums.h"
#include "engine/cpu/vector_exp.h"
#include "engine/cpu/x86_intrinsics.h"
#include "gtest/gtest.h"

namespace pdserve::engine::cpu {
namespace {

// Random values that are exactly bf16 numbers.
std::vector<float> Bf16ExactValues(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    uint32_t bits;
    const float f = dist(gen);
    std::memcpy(&bits, &f, sizeof bits);
    bits &= 0xFFFF0000u;
    std::memcpy(&x, &bits, sizeof bits);
  }
  return v;
}

TEST(Bf16Test, ExactnessRoundTrip) {
  const std::vector<float> exact = Bf16ExactValues(1000, 1);
  EXPECT_TRUE(IsBf16Exact(exact.data(), 1000));
  const std::vector<uint16_t> packed = ToBf16(exact.data(), 1000);
  std::vector<float> back(1000);
  Bf16ToFloat(packed.data(), back.data(), 1000);
  EXPECT_EQ(std::memcmp(back.data(), exact.data(), 1000 * sizeof(float)), 0);
  std::vector<float> inexact = exact;
  inexact[517] = 1.0f + 1.0f / 1024;  // needs more than bf16's 8 mantissa bits
  EXPECT_FALSE(IsBf16Exact(inexact.data(), 1000));
}

// DotsOfOneKey and AxpysOfOneValue against float64 sums, for head sizes with
// and without a 16-lane tail and above the register-resident limit (256).
TEST(AttentionKernelsTest, GroupedDotsAndAxpysMatchPlainSums) {
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int n : {1, 15, 16, 17, 64, 100, 128, 256, 300}) {
    for (int count : {1, 3, 8}) {
      const int64_t stride = 5;
      std::vector<float> q(static_cast<size_t>(count) * n), k(n), v(n);
      for (float& x : q) x = dist(gen);
      for (float& x : k) x = dist(gen);
      for (float& x : v) x = dist(gen);
      std::vector<float> scores(static_cast<size_t>(count * stride), -1.0f);
      DotsOfOneKey(q.data(), count, k.data(), n, 0.125f, scores.data(), stride);
      std::vector<float> out(q.size(), 0.5f);
      AxpysOfOneValue(scores.data(), stride, v.data(), n, out.data(), count);
      for (int j = 0; j < count; ++j) {
        double dot = 0, abs_sum = 0;
        for (int i = 0; i < n; ++i) {
          dot += double{q[j * n + i]} * k[i];
          abs_sum += std::abs(double{q[j * n + i]} * k[i]);
        }
        const float s = scores[j * stride];
        EXPECT_NEAR(s, 0.125 * dot, 0.125 * abs_sum * 1e-6 + 1e-30)
            << n << " " << count << " " << j;
        EXPECT_EQ(scores[j * stride + 1], -1.0f) << "wrote between the strided scores";
        for (int i = 0; i < n; ++i) {
          EXPECT_NEAR(out[j * n + i], 0.5 + double{s} * v[i], 1e-6) << n << " " << j << " " << i;
        }
      }
    }
  }
}

// The block kernels give what the one-key kernels give key by key, bit for
// bit (a row's attention does not depend on how its keys fall into blocks),
// for head sizes on both sides of the register-resident limit (128) and runs
// of keys on both sides of 16.
TEST(AttentionKernelsTest, BlockKernelsGiveTheOneKeyKernelsExactly) {
  std::mt19937 gen(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int n : {1, 15, 16, 17, 32, 64, 100, 128, 129, 256, 300}) {
    for (int count : {1, 2, 3, 5}) {
      for (int tokens : {1, 7, 16, 17, 40}) {
        const int64_t kv_stride = n + 3, stride = tokens + 2;
        std::vector<float> q(static_cast<size_t>(count) * n);
        std::vector<float> k(static_cast<size_t>(tokens * kv_stride));
        std::vector<float> v(k.size());
        for (float& x : q) x = dist(gen);
        for (float& x : k) x = dist(gen);
        for (float& x : v) x = dist(gen);
        std::vector<float> block(static_cast<size_t>(count * stride), -1.0f), one = block;
        DotsOfKeys(q.data(), count, k.data(), kv_stride, tokens, n, 0.17f, block.data(), stride);
        for (int t = 0; t < tokens; ++t) {
          DotsOfOneKey(q.data(), count, k.data() + t * kv_stride, n, 0.17f, one.data() + t, stride);
        }
        ASSERT_EQ(block, one) << "scores, n " << n << " count " << count << " tokens " << tokens;
        std::vector<float> out_block(q.size(), 0.25f), out_one = out_block;
        AxpysOfValues(block.data(), stride, v.data(), kv_stride, tokens, n, out_block.data(),
                      count);
        for (int t = 0; t < tokens; ++t) {
          AxpysOfOneValue(one.data() + t, stride, v.data() + t * kv_stride, n, out_one.data(),
                          count);
        }
        ASSERT_EQ(out_block, out_one)
            << "outputs, n " << n << " count " << count << " tokens " << tokens;
      }
    }
  }
}

// ExpFloats against std::exp over a spread of every float's bit patterns
// (every 4093rd, both signs: normal, subnormal, the |x| >= 88 cases, the
// infinities and NaN), odd lengths included. With glibc it computes glibc's
// expf, bit for bit (checked over every float once; this is the sample that
// stays in the suite); with another C library, within an ulp.
TEST(VectorExpTest, MatchesStdExp) {
  std::vector<float> in;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 4093) {
    float x;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&x, &b, sizeof x);
    in.push_back(x);
  }
  for (float x : {0.0f, -0.0f, 88.0f, -88.0f, 88.72f, -103.3f, -104.0f, 1e-30f, -1e-30f}) {
    in.push_back(x);
  }
  in.push_back(std::numeric_limits<float>::infinity());
  in.push_back(-std::numeric_limits<float>::infinity());
  in.push_back(std::numeric_limits<float>::quiet_NaN());
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, static_cast<int64_t>(in.size())}) {
    std::vector<float> out(static_cast<size_t>(n));
    ExpFloats(in.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float want = std::exp(in[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[i])) << in[i];
        continue;
      }
#if defined(__GLIBC__)
      ASSERT_EQ(std::memcmp(&out[i], &want, sizeof want), 0)
          << std::hexfloat << in[i] << ": " << out[i] << " against " << want;
#else
      ASSERT_LE(std::abs(out[i] - want), std::abs(std::nextafter(want, 0.0f) - want) * 1.01f)
          << std::hexfloat << in[i];
#endif
    }
  }
}

#if defined(__x86_64__)
// SumLanes16's lane r is SumLanes of vector r, bit for bit; and SumLanes sums
// in the order of GCC's _mm512_reduce_add_ps, which the kernels used before.
__attribute__((target("avx512f"))) void CheckLaneSums(uint32_t seed) {
  std::mt19937 gen(seed);
  // Magnitudes spread over many binades, so that a different order of the
  // additions would round differently.
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  alignas(64) float lanes[16][16];
  __m512 v[16];
  for (int r = 0; r < 16; ++r) {
    for (float& x : lanes[r]) x = std::ldexp(mantissa(gen), exponent(gen));
    v[r] = _mm512_load_ps(lanes[r]);
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, SumLanes16(v));
  for (int r = 0; r < 16; ++r) {
    ASSERT_EQ(sums[r], SumLanes(v[r])) << "vector " << r;
#if defined(__GNUC__) && !defined(__clang__)
    ASSERT_EQ(SumLanes(v[r]), _mm512_reduce_add_ps(v[r])) << "vector " << r;
#endif
  }
}

TEST(LaneSumsTest, SixteenAtOnceSumAsOneAtATime) {
  if (BestIsa() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (uint32_t seed = 1; seed <= 200; ++seed) CheckLaneSums(seed);
}

// HorizontalSums8's lane r is HorizontalSum8 of vector r, bit for bit.
__attribute__((target("avx2"))) void CheckHorizontalSums8(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  alignas(32) float lanes[8][8];
  __m256 v[8];
  for (int r = 0; r < 8; ++r) {
    for (float& x : lanes[r]) x = std::ldexp(mantissa(gen), exponent(gen));
    v[r] = _mm256_load_ps(lanes[r]);
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, HorizontalSums8(v));
  for (int r = 0; r < 8; ++r) {
    const float* x = lanes[r];
    // HorizontalSum8's tree, written out.
    const float want = ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]));
    ASSERT_EQ(HorizontalSum8(v[r]), want) << "vector " << r;
    ASSERT_EQ(sums[r], want) << "vector " << r;
  }
}

TEST(LaneSumsTest, EightAtOnceSumAsOneAtATimeWithAvx2) {
  if (BestIsa() < Isa::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  for (uint32_t seed = 1; seed <= 200; ++seed) CheckHorizontalSums8(seed);
}
#endif

}  // namespace
}  // namespace pdserve::engine::cpu
