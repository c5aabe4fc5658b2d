// CPU kernels: bf16 packing and attention's grouped dot products. The weight
// matmuls are tested in weight_matrix_test.cc.
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

}  // namespace
}  // namespace pdserve::engine::cpu
