// 4-bit weights (kernels_int4.h, WeightMatrix with WeightDtype::kInt4)
// against float64 references computed here, over shapes that hit every tail
// (columns not a multiple of 32 or 128, rows not a multiple of a thread's
// block), on every instruction set this CPU runs.
//
// Error bounds, per output y = sum_i w_i x_i of a row of k values:
//   against the stored nibbles and the int8-rounded activations: the
//     integer group sums are exact, so only fp32 summation and one rounding
//     per group's scale product: 2 * (k + 1) * 2^-24 * sum_i |w'_i x'_i|;
//   against the fp32 matrix and activations: each weight moves by at most
//     |d| / 2 of its group's scale d (|d| for a value clamped from 8 to 7),
//     each activation by half its group's step sx (max |x| / 127):
//     |y - sum wx| <= sum_i |x_i| |d(i)| + sum_i |w'_i| sx(i) / 2.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/kernels_gemv.h"
#include "engine/cpu/kernels_int4.h"
#include "engine/cpu/weight_matrix.h"
#include "engine/cpu/work_pool.h"
#include "engine/model/safetensors.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/gemv_reference.h"

namespace pdserve::engine::cpu {
namespace {

using testing_gemv::Exact;
using testing_gemv::IsasHere;
using testing_gemv::Normal;
using testing_gemv::Reference;

// Rows quantized by QuantizeInt4, and their values back in fp32.
struct Int4Rows {
  std::vector<uint8_t> q;
  std::vector<uint16_t> scales;
  std::vector<float> values;
};
Int4Rows Quantize(const std::vector<float>& w, int64_t n, int64_t k) {
  Int4Rows out{std::vector<uint8_t>(static_cast<size_t>(n * Int4RowBytes(k))),
               std::vector<uint16_t>(static_cast<size_t>(n * Int8Groups(k))),
               std::vector<float>(w.size())};
  QuantizeInt4(w.data(), n, k, out.q.data(), out.scales.data());
  DequantizeInt4(out.q.data(), out.scales.data(), n, k, out.values.data());
  return out;
}

// x as GemvInt4 and the int4 GEMM see it: each row rounded to int8 in
// groups of 32 (QuantizeInt8), back in fp32.
std::vector<float> RoundedToInt8(const std::vector<float>& x, int m, int k) {
  std::vector<float> out(x.size());
  RoundActivations(x.data(), m, k, 8, out.data());
  return out;
}

TEST(QuantizeInt4Test, FollowsTheDefinition) {
  for (int k : {1, 5, 31, 32, 33, 64, 100}) {
    const int n = 3;
    std::vector<float> w = Normal(int64_t{n} * k, 10 + k);
    w[0] = 0;  // a row may hold zeros; an all-zero group below
    if (k >= 64) std::fill(w.begin() + 32, w.begin() + 64, 0.0f);
    const Int4Rows q = Quantize(w, n, k);
    for (int r = 0; r < n; ++r) {
      for (int64_t g = 0; g < Int8Groups(k); ++g) {
        const int begin = static_cast<int>(g * 32), end = std::min(k, begin + 32);
        float largest = 0;
        for (int c = begin; c < end; ++c) {
          if (std::abs(w[r * k + c]) > std::abs(largest)) largest = w[r * k + c];
        }
        const uint16_t half = q.scales[r * Int8Groups(k) + g];
        ASSERT_EQ(half, FloatToHalf(largest / -8.0f)) << k << " " << r << " " << g;
        const float d = HalfToFloat(half);
        const uint8_t* bytes = &q.q[(r * Int8Groups(k) + g) * kInt4GroupBytes];
        for (int j = 0; j < 32; ++j) {
          const int nibble = j < 16 ? bytes[j] & 0xf : bytes[j - 16] >> 4;
          const int c = begin + j;
          const int want =
              c < end && d != 0
                  ? static_cast<int>(std::clamp(std::nearbyint(w[r * k + c] / d), -8.0f, 7.0f))
                  : 0;  // padding of a short group: q = 0
          ASSERT_EQ(nibble - 8, want) << k << " " << r << " " << c;
          if (c < end) {
            const float v = w[r * k + c], back = q.values[r * k + c];
            EXPECT_EQ(back, static_cast<float>(want) * d);
            // Within half a step, or a full one where 8 was clamped to 7.
            EXPECT_LE(std::abs(v - back), std::abs(d) * (want == 7 ? 1.0f : 0.5f) * 1.0001f)
                << k << " " << r << " " << c;
          }
        }
      }
    }
  }
}

TEST(QuantizeInt4Test, TheLargestValueIsExactAndHugeScalesSaturate) {
  std::vector<float> w(32, 1.0f);
  w[7] = -3.0f;  // largest magnitude: q = -8 exactly, d = 0.375
  Int4Rows q = Quantize(w, 1, 32);
  EXPECT_EQ(q.values[7], -3.0f);
  EXPECT_EQ(HalfToFloat(q.scales[0]), 0.375f);
  w.assign(32, 0.0f);
  w[0] = 1e7f;  // d = -1.25e6 does not fit fp16: saturates, stays finite
  q = Quantize(w, 1, 32);
  EXPECT_EQ(HalfToFloat(q.scales[0]), -65504.0f);
  for (float v : q.values) EXPECT_TRUE(std::isfinite(v));
}

TEST(GemvInt4Test, MatchesItsStoredValuesOnEveryIsa) {
  uint32_t seed = 100;
  for (int n : {1, 3, 17, 33}) {
    for (int k : {1, 7, 31, 32, 33, 63, 64, 65, 96, 100, 127, 128, 129, 160, 192, 777}) {
      const std::vector<float> w = Normal(int64_t{n} * k, ++seed);
      const std::vector<float> x = Normal(k, ++seed);
      const Int4Rows wq = Quantize(w, n, k);
      Int4Activations xq;
      QuantizeActivations(x.data(), k, xq);
      const Reference ref = Exact(wq.values, RoundedToInt8(x, 1, k), 1, n, k);
      for (Isa isa : IsasHere()) {
        std::vector<float> y(n, std::nanf(""));
        GemvInt4(wq.q.data(), wq.scales.data(), xq, y.data(), n, k, isa);
        for (int r = 0; r < n; ++r) {
          EXPECT_LE(std::abs(y[r] - ref.y[r]), 2 * ref.bound[r])
              << IsaName(isa) << (HasAvx512Vnni() ? " (vnni) " : " ") << n << "x" << k << " row "
              << r;
        }
      }
    }
  }
}

// The extremes: nibbles 0 and 15 (q = -8 and 7) against activations of +-127
// and -127 + 1; with unit scales every output is an integer sum, which every
// kernel must return exactly.
TEST(GemvInt4Test, ExtremeValuesAreExact) {
  const int k = 256 + 96;  // two 128-value blocks and a short one
  std::vector<float> x(k);
  for (int i = 0; i < k; ++i) x[i] = i % 3 == 0 ? 127.0f : (i % 3 == 1 ? -127.0f : -126.0f);
  Int4Activations xq;
  QuantizeActivations(x.data(), k, xq);
  for (int64_t g = 0; g < Int8Groups(k); ++g) ASSERT_EQ(xq.scales[g], 1.0f);
  const int n = 4;
  std::vector<uint8_t> q(static_cast<size_t>(n * Int4RowBytes(k)));
  std::vector<uint16_t> scales(static_cast<size_t>(n * Int8Groups(k)), FloatToHalf(1.0f));
  std::vector<double> want(n, 0.0);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      // Row 0 all -8, row 1 all 7, row 2 the sign that maximises the sum,
      // row 3 alternating.
      const int value = r == 0 ? -8 : r == 1 ? 7 : r == 2 ? (x[i] > 0 ? 7 : -8) : (i % 2 ? 7 : -8);
      uint8_t& byte = q[r * Int4RowBytes(k) + (i / 32) * 16 + (i % 32) % 16];
      byte |= static_cast<uint8_t>((value + 8) << ((i % 32) < 16 ? 0 : 4));
      want[r] += double{x[i]} * value;
    }
  }
  for (Isa isa : IsasHere()) {
    std::vector<float> y(n);
    GemvInt4(q.data(), scales.data(), xq, y.data(), n, k, isa);
    for (int r = 0; r < n; ++r) EXPECT_EQ(y[r], want[r]) << IsaName(isa) << " row " << r;
  }
}

// Int4ToInt8 (what the int8 GEMM multiplies) is the stored matrix exactly:
// value * scale is DequantizeInt4's value, every value in [-8, 7], on every
// tail of a row (the vector path takes whole groups, 8 scales at a time).
TEST(Int4ToInt8Test, WidensToTheStoredValuesExactly) {
  uint32_t seed = 900;
  for (int k : {1, 13, 32, 96, 256, 288, 777}) {
    const int n = 5;
    const std::vector<float> w = Normal(int64_t{n} * k, ++seed);
    const int64_t groups = Int8Groups(k);
    std::vector<uint8_t> q(static_cast<size_t>(n * Int4RowBytes(k)));
    std::vector<uint16_t> scales(static_cast<size_t>(n * groups));
    QuantizeInt4(w.data(), n, k, q.data(), scales.data());
    std::vector<float> stored(w.size());
    DequantizeInt4(q.data(), scales.data(), n, k, stored.data());
    std::vector<int8_t> values(w.size(), 99);
    std::vector<float> value_scales(scales.size(), -1.0f);
    Int4ToInt8(q.data(), scales.data(), n, k, values.data(), value_scales.data());
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < k; ++i) {
        const int8_t v = values[r * k + i];
        ASSERT_GE(v, -8) << k << " " << r << " " << i;
        ASSERT_LE(v, 7) << k << " " << r << " " << i;
        ASSERT_EQ(static_cast<float>(v) * value_scales[r * groups + i / 32], stored[r * k + i])
            << k << " " << r << " " << i;
      }
      for (int64_t g = 0; g < groups; ++g) {
        ASSERT_EQ(value_scales[r * groups + g], HalfToFloat(scales[r * groups + g]));
      }
    }
  }
}

// WeightMatrix::MatMul with int4 storage: the GEMV (m == 1, OpenMP threads
// or a WorkPool), sgemm (2-64 rows) and the int8 GEMM (prefill, above 64
// rows) all give the product of the stored weights and the int8-rounded
// activations.
TEST(Int4MatrixTest, MatMulMatchesItsStoredValues) {
  uint32_t seed = 200;
  WorkPool pool(3);
  for (int m : {1, 2, 17, 70}) {
    for (int n : {1, 7, 64, 131}) {
      for (int k : {1, 13, 96, 777}) {
        const std::vector<float> w = Normal(int64_t{n} * k, ++seed);
        const std::vector<float> x = Normal(int64_t{m} * k, ++seed);
        const WeightMatrix mat = WeightMatrix::FromF32(w, n, k, WeightDtype::kInt4);
        ASSERT_EQ(mat.storage(), WeightMatrix::Storage::kInt4);
        std::vector<float> stored(w.size());
        mat.RowsToFloat(0, n, stored.data());
        EXPECT_EQ(stored, Quantize(w, n, k).values);
        const Reference ref = Exact(stored, RoundedToInt8(x, m, k), m, n, k);
        for (int threads : {1, 2}) {
          for (WorkPool* p : {static_cast<WorkPool*>(nullptr), &pool}) {
            std::vector<float> y(static_cast<size_t>(m) * n, std::nanf(""));
            mat.MatMul(x.data(), y.data(), m, threads, p);
            for (size_t i = 0; i < y.size(); ++i) {
              ASSERT_LE(std::abs(y[i] - ref.y[i]), 2 * ref.bound[i])
                  << "m " << m << " n " << n << " k " << k << " threads " << threads
                  << (p ? " pool" : "") << " at " << i;
            }
          }
        }
      }
    }
  }
}

// Against the fp32 matrix and activations: within the bound of the file
// comment, and (independent rounding errors cancelling) well inside it.
TEST(Int4MatrixTest, MatMulIsWithinItsStepsOfFp32) {
  const int n = 96, k = 768;
  const std::vector<float> w = Normal(int64_t{n} * k, 300);
  const WeightMatrix mat = WeightMatrix::FromF32(w, n, k, WeightDtype::kInt4);
  EXPECT_EQ(mat.bytes(), int64_t{n} * (k / 2 + k / 32 * 2));  // 4.5 bits per weight
  std::vector<float> stored(w.size());
  mat.RowsToFloat(0, n, stored.data());
  for (int m : {1, 16}) {
    const std::vector<float> x = Normal(int64_t{m} * k, 301 + m);
    const Reference ref = Exact(w, x, m, n, k);
    std::vector<float> y(static_cast<size_t>(m) * n);
    mat.MatMul(x.data(), y.data(), m, 2);
    double worst = 0;
    for (int i = 0; i < m; ++i) {
      const float* xi = &x[int64_t{i} * k];
      for (int r = 0; r < n; ++r) {
        double bound = 0;
        for (int g = 0; g < k / 32; ++g) {
          float w_max = 0, x_max = 0;
          for (int c = 32 * g; c < 32 * g + 32; ++c) {
            w_max = std::max(w_max, std::abs(w[int64_t{r} * k + c]));
            x_max = std::max(x_max, std::abs(xi[c]));
          }
          for (int c = 32 * g; c < 32 * g + 32; ++c) {
            bound += std::abs(double{xi[c]}) * (w_max / 8) * 1.001 +
                     std::abs(double{stored[int64_t{r} * k + c]}) * (x_max / 127) / 2;
          }
        }
        const int64_t at = int64_t{i} * n + r;
        const double err = std::abs(y[at] - ref.y[at]);
        EXPECT_LE(err, bound + 2 * ref.bound[at]) << "m " << m << " row " << r;
        worst = std::max(worst, err / bound);
      }
    }
    EXPECT_LT(worst, 0.5) << "m " << m;
  }
}

}  // namespace
}  // namespace pdserve::engine::cpu
