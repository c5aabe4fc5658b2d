// CPU kernels: bf16 packing. The weight matmuls are tested in
// weight_matrix_test.cc.
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

}  // namespace
}  // namespace pdserve::engine::cpu
