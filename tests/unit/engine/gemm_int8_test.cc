// The int8 GEMM of kernels_gemm_int8.h: every instruction set this CPU runs
// gives the portable kernel's bits, and the portable kernel gives the
// float64 product of the quantized values within fp32 summation error, over
// shapes with every kind of tail (rows not a multiple of a 16-row panel or a
// 64-row chunk, columns not a multiple of 4, 32 or 64, 1 to 17 activation
// rows: every count of the kernels' row passes and their remainders).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/cpu/kernels_gemm_int8.h"
#include "engine/cpu/kernels_gemv.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/gemv_reference.h"

namespace pdserve::engine::cpu {
namespace {

using testing_gemv::Exact;
using testing_gemv::IsasHere;
using testing_gemv::Normal;
using testing_gemv::Quantize;
using testing_gemv::QuantizedRows;
using testing_gemv::Reference;

TEST(GemmInt8Test, ActivationRowsAreQuantizeInt8RowsPaddedWithZeros) {
  for (int k : {1, 31, 32, 33, 100}) {
    const int m = 3;
    const std::vector<float> x = Normal(int64_t{m} * k, 10 + k);
    const QuantizedRows ref = Quantize(x, m, k);
    Int8ActivationRows rows;
    QuantizeActivationRows(x.data(), m, k, rows);
    ASSERT_EQ(rows.m, m);
    ASSERT_EQ(rows.k, k);
    ASSERT_EQ(rows.stride, Int8Groups(k) * 32);
    ASSERT_TRUE(
        std::equal(rows.scales.begin(), rows.scales.end(), ref.scales.begin(), ref.scales.end()));
    for (int t = 0; t < m; ++t) {
      for (int i = 0; i < rows.stride; ++i) {
        const int8_t want = i < k ? ref.q[static_cast<size_t>(t) * k + i] : 0;
        const size_t at = static_cast<size_t>(t) * rows.stride + i;
        ASSERT_EQ(rows.q[at], want) << k << " " << t << " " << i;
        ASSERT_EQ(rows.biased[at], static_cast<uint8_t>(want + 128)) << k << " " << t << " " << i;
      }
    }
  }
}

TEST(GemmInt8Test, EveryIsaGivesThePortableBitsAndTheExactProduct) {
  uint32_t seed = 1000;
  for (int n : {1, 15, 16, 17, 33, 64, 65, 131}) {
    for (int k : {1, 7, 31, 32, 33, 64, 65, 100, 777}) {
      const int max_m = (n == 17 || n == 131) ? 17 : 5;
      for (int m = 1; m <= max_m; ++m) {
        const std::vector<float> w = Normal(int64_t{n} * k, ++seed);
        const std::vector<float> x = Normal(int64_t{m} * k, ++seed);
        const QuantizedRows wq = Quantize(w, n, k);
        const QuantizedRows xq = Quantize(x, m, k);
        Int8ActivationRows rows;
        QuantizeActivationRows(x.data(), m, k, rows);
        const Reference ref = Exact(wq.values, xq.values, m, n, k);
        // y in a wider array (ldy = n + 3) whose extra columns must stay
        // untouched.
        const int64_t ldy = n + 3;
        std::vector<float> portable;
        for (Isa isa : IsasHere()) {
          std::vector<float> y(static_cast<size_t>(m * ldy), -7.0f);
          GemmInt8(wq.q.data(), wq.scales.data(), n, rows, y.data(), ldy, isa);
          for (int t = 0; t < m; ++t) {
            for (int r = 0; r < n + 3; ++r) {
              const float got = y[t * ldy + r];
              if (r >= n) {
                ASSERT_EQ(got, -7.0f) << IsaName(isa) << " wrote past row " << n;
                continue;
              }
              const int64_t at = int64_t{t} * n + r;
              // Scale products add one fp32 rounding per group to the bound.
              ASSERT_LE(std::abs(got - ref.y[at]), 2 * ref.bound[at])
                  << IsaName(isa) << " " << m << "x" << n << "x" << k << " at " << t << "," << r;
            }
          }
          if (isa == Isa::kPortable) {
            portable = y;
          } else {
            ASSERT_EQ(std::memcmp(y.data(), portable.data(), y.size() * sizeof(float)), 0)
                << IsaName(isa) << (HasAvx512Vnni() ? " (vnni) " : " ") << m << "x" << n << "x"
                << k;
          }
        }
      }
    }
  }
}

// Extreme values: weights and activations at +-127 in every pattern, where a
// saturating 16-bit step (vpmaddubsw on biased values) would go wrong.
TEST(GemmInt8Test, ExtremeValuesAreExact) {
  const int n = 33, k = 96, m = 5;
  std::vector<float> w(static_cast<size_t>(n) * k), x(static_cast<size_t>(m) * k);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      w[static_cast<size_t>(r) * k + i] = ((r + i) % 3 == 0) ? -1.0f : 1.0f;
    }
  }
  for (int t = 0; t < m; ++t) {
    for (int i = 0; i < k; ++i) x[static_cast<size_t>(t) * k + i] = ((t * i) % 2) ? -1.0f : 1.0f;
  }
  const QuantizedRows wq = Quantize(w, n, k);
  Int8ActivationRows rows;
  QuantizeActivationRows(x.data(), m, k, rows);
  for (Isa isa : IsasHere()) {
    std::vector<float> y(static_cast<size_t>(m) * n);
    GemmInt8(wq.q.data(), wq.scales.data(), n, rows, y.data(), n, isa);
    for (int t = 0; t < m; ++t) {
      for (int r = 0; r < n; ++r) {
        double want = 0;
        for (int i = 0; i < k; ++i) {
          want += double{w[static_cast<size_t>(r) * k + i]} * x[static_cast<size_t>(t) * k + i];
        }
        // +-1 quantize to +-127 with scale 1/127: the products are exact.
        ASSERT_NEAR(y[static_cast<size_t>(t) * n + r], want, 1e-4 * k) << IsaName(isa);
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::engine::cpu
