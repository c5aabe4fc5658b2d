// CPU kernels: the bf16-weight matmul against the fp32 one on the same
// numbers, over shapes that hit every tail (rows not a multiple of 4 or of a
// thread's block, columns not a multiple of 8) and both GEMV code paths.
#include "engine/cpu/kernels.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& want) {
  double max_abs = 1e-6, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(static_cast<double>(want[i])));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  return max_diff / max_abs;
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

TEST(Bf16Test, MatMulEqualsFp32MatMulOnEveryShape) {
  uint32_t seed = 2;
  for (int m : {1, 2, 5, 17}) {
    for (int n : {1, 3, 7, 64, 131}) {
      for (int k : {1, 8, 13, 96, 777}) {
        for (int threads : {1, 2}) {
          const std::vector<float> w = Bf16ExactValues(int64_t{n} * k, ++seed);
          const std::vector<float> x = Bf16ExactValues(int64_t{m} * k, ++seed);
          const std::vector<uint16_t> w16 = ToBf16(w.data(), int64_t{n} * k);
          std::vector<float> want(static_cast<size_t>(m) * n), got(want.size());
          MatMulTransB(x.data(), w.data(), want.data(), m, n, k, threads);
          MatMulTransBBf16(x.data(), w16.data(), got.data(), m, n, k, threads);
          // Same products, other summation order: fp32 rounding only.
          EXPECT_LT(MaxRelDiff(got, want), 1e-5)
              << "m " << m << " n " << n << " k " << k << " threads " << threads;
        }
      }
    }
  }
}

TEST(Bf16Test, SimdAndPortableGemvAgree) {
  for (int n : {1, 4, 6, 33}) {
    for (int k : {1, 7, 8, 100}) {
      const std::vector<float> w = Bf16ExactValues(int64_t{n} * k, 100 + n * k);
      const std::vector<float> x = Bf16ExactValues(k, 200 + k);
      const std::vector<uint16_t> w16 = ToBf16(w.data(), int64_t{n} * k);
      std::vector<float> want(n), simd(n), portable(n);
      MatMulTransB(x.data(), w.data(), want.data(), 1, n, k, 1);
      GemvBf16(w16.data(), x.data(), simd.data(), n, k, /*simd=*/true);
      GemvBf16(w16.data(), x.data(), portable.data(), n, k, /*simd=*/false);
      EXPECT_LT(MaxRelDiff(simd, want), 1e-5) << n << "x" << k;
      EXPECT_LT(MaxRelDiff(portable, want), 1e-5) << n << "x" << k;
    }
  }
}

}  // namespace
}  // namespace pdserve::engine::cpu
