// WeightMatrix and the GEMV kernels of kernels_gemv.h, against float64
// references computed here, over shapes that hit every tail (columns not a
// multiple of 8, 16, 32 or 64; rows not a multiple of a thread's block), on
// every instruction set this CPU runs.
//
// Error bounds, per output y = sum_i w_i x_i of a row of k values:
//   fp32 and bf16 storage: the stored values exactly, so only fp32
//     summation: |y - exact| <= k * 2^-24 * sum_i |w_i x_i| (a gamma_k bound
//     with room for any summation order);
//   int8 against the fp32 matrix it was quantized from: each value moves by
//     at most half its group's scale step, so
//     |y_int8 - y_fp32| <= sum_i |x_i| * scale(i) / 2, plus the fp32
//     summation bound above;
//   w8a8 (x rounded the same way, scale sx per group of x) against fp32:
//     with w' and x' the rounded values,
//     |sum w'x' - sum wx| <= sum_i |x_i| * scale(i) / 2 + sum_i |w'_i| * sx(i) / 2,
//     plus the summation bound; against sum w'x' only the summation bound.
#include "engine/cpu/weight_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_gemv.h"
#include "engine/cpu/work_pool.h"
#include "engine/model/safetensors.h"
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

const int kCols[] = {1, 7, 8, 13, 16, 31, 32, 33, 64, 65, 100, 777};
const int kRows[] = {1, 3, 17, 33};

TEST(GemvTest, F32AndBf16MatchTheExactProductOnEveryIsa) {
  uint32_t seed = 1;
  for (int n : kRows) {
    for (int k : kCols) {
      const std::vector<float> w = Normal(int64_t{n} * k, ++seed, /*bf16_exact=*/true);
      const std::vector<float> x = Normal(k, ++seed);
      const std::vector<uint16_t> w16 = ToBf16(w.data(), int64_t{n} * k);
      const Reference ref = Exact(w, x, 1, n, k);
      for (Isa isa : IsasHere()) {
        std::vector<float> y32(n), y16(n);
        GemvF32(w.data(), x.data(), y32.data(), n, k, isa);
        GemvBf16(w16.data(), x.data(), y16.data(), n, k, isa);
        for (int r = 0; r < n; ++r) {
          EXPECT_LE(std::abs(y32[r] - ref.y[r]), ref.bound[r])
              << IsaName(isa) << " f32 " << n << "x" << k << " row " << r;
          EXPECT_LE(std::abs(y16[r] - ref.y[r]), ref.bound[r])
              << IsaName(isa) << " bf16 " << n << "x" << k << " row " << r;
        }
      }
    }
  }
}

// Several vectors at once give each vector's single-vector GEMV bit for bit
// (a sequence's numbers do not depend on what shares its step), on every ISA.
TEST(GemvTest, ManyVectorsGiveEachVectorsGemvExactly) {
  uint32_t seed = 90;
  for (int m : {2, 3, 4, 5, 6, 7, 8, 13, 16}) {
    for (int n : {1, 2, 17}) {  // one row, a pair of rows, pairs and one more
      for (int k : {7, 32, 33, 100, 777}) {
        const std::vector<float> w = Normal(int64_t{n} * k, ++seed);
        const std::vector<float> x = Normal(int64_t{m} * k, ++seed);
        const std::vector<uint16_t> w16 = ToBf16(w.data(), int64_t{n} * k);
        for (Isa isa : IsasHere()) {
          std::vector<float> many32(int64_t{m} * n), many16(int64_t{m} * n);
          GemvManyF32(w.data(), x.data(), m, many32.data(), n, n, k, isa);
          GemvManyBf16(w16.data(), x.data(), m, many16.data(), n, n, k, isa);
          for (int v = 0; v < m; ++v) {
            std::vector<float> one32(n), one16(n);
            GemvF32(w.data(), x.data() + int64_t{v} * k, one32.data(), n, k, isa);
            GemvBf16(w16.data(), x.data() + int64_t{v} * k, one16.data(), n, k, isa);
            for (int r = 0; r < n; ++r) {
              ASSERT_EQ(many32[int64_t{v} * n + r], one32[r])
                  << IsaName(isa) << " f32 m " << m << " " << n << "x" << k << " vector " << v;
              ASSERT_EQ(many16[int64_t{v} * n + r], one16[r])
                  << IsaName(isa) << " bf16 m " << m << " " << n << "x" << k << " vector " << v;
            }
          }
        }
      }
    }
  }
}

// x as GemvInt8 and the int8 GEMM see it: each row rounded to 16 bits in
// groups of 32, back in fp32.
std::vector<float> Rounded16(const std::vector<float>& x, int m, int k) {
  std::vector<int16_t> q(x.size());
  std::vector<float> scales(static_cast<size_t>(m * Int8Groups(k))), out(x.size());
  QuantizeActivations16(x.data(), m, k, q.data(), scales.data());
  DequantizeActivations16(q.data(), scales.data(), m, k, out.data());
  return out;
}

// x as GemvInt8Act and the w8a8 GEMM see it: each row rounded to int8 in
// groups of 32, back in fp32.
std::vector<float> RoundedActivations(const std::vector<float>& x, int m, int k) {
  return Quantize(x, m, k).values;
}

// int8 rows times x quantized as `Activations` by `gemv` (GemvInt8 or
// GemvInt8Act), on every ISA and on rows with every kind of tail, against
// the exact product of the stored weights and x as `rounded` gives it.
template <typename Activations, typename Gemv>
void ExpectInt8GemvMatchesRoundedValues(uint32_t seed, Gemv gemv,
                                        std::vector<float> (*rounded)(const std::vector<float>&,
                                                                      int, int)) {
  for (int n : kRows) {
    for (int k : {1, 7, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 192, 777}) {
      const std::vector<float> w = Normal(int64_t{n} * k, ++seed);
      const std::vector<float> x = Normal(k, ++seed);
      const QuantizedRows wq = Quantize(w, n, k);
      Activations xq;
      QuantizeActivations(x.data(), k, xq);
      const Reference ref = Exact(wq.values, rounded(x, 1, k), 1, n, k);
      for (Isa isa : IsasHere()) {
        std::vector<float> y(n);
        gemv(wq.q.data(), wq.scales.data(), xq, y.data(), n, k, isa);
        for (int r = 0; r < n; ++r) {
          // Scale products add one fp32 rounding per group to the bound.
          EXPECT_LE(std::abs(y[r] - ref.y[r]), 2 * ref.bound[r])
              << IsaName(isa) << (HasAvx512Vnni() ? " (vnni) " : " ") << n << "x" << k << " row "
              << r;
        }
      }
    }
  }
}

TEST(GemvTest, Int8MatchesItsDequantizedValuesOnEveryIsa) {
  ExpectInt8GemvMatchesRoundedValues<Int16Activations>(
      100,
      [](const int8_t* q, const float* s, const Int16Activations& x, float* y, int n, int k,
         Isa isa) { GemvInt8(q, s, x, y, n, k, isa); },
      Rounded16);
}

TEST(GemvTest, Int8ActMatchesItsRoundedValuesOnEveryIsa) {
  ExpectInt8GemvMatchesRoundedValues<Int8Activations>(
      150,
      [](const int8_t* q, const float* s, const Int8Activations& x, float* y, int n, int k,
         Isa isa) { GemvInt8Act(q, s, x, y, n, k, isa); },
      RoundedActivations);
}

// The extremes of both operands: weights of +-127 (and the -128 no quantizer
// writes) against activations of +-32767, whose hi bytes are the largest the
// VNNI kernel's flipped products and shift see. Integer sums must be exact.
TEST(GemvTest, Int8ExtremeValuesAreExact) {
  for (int k : {32, 64, 96, 128, 200}) {
    const int n = 8;
    std::vector<int8_t> q(static_cast<size_t>(n) * k);
    std::vector<float> scales(static_cast<size_t>(n * Int8Groups(k)), 1.0f);
    std::vector<float> x(k);
    for (int i = 0; i < k; ++i) x[i] = (i % 3 == 0) ? -1.0f : 1.0f;
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < k; ++i) {
        const int8_t v = r == 0            ? 127
                         : r == 1          ? -127
                         : r == 2          ? -128
                         : (i * 7 + r) % 2 ? 127
                                           : -128;
        q[static_cast<size_t>(r) * k + i] = r == 3 ? static_cast<int8_t>(x[i] > 0 ? 127 : -128) : v;
      }
    }
    Int16Activations xq;
    QuantizeActivations(x.data(), k, xq);
    for (int i = 0; i < k; ++i) ASSERT_EQ(xq.q[i], x[i] > 0 ? 32767 : -32767);
    for (int r = 0; r < n; ++r) {
      double expect = 0;  // integer dot times the activation scale 1 / 32767
      for (int i = 0; i < k; ++i) {
        expect += q[static_cast<size_t>(r) * k + i] * static_cast<double>(xq.q[i]);
      }
      expect *= xq.scales[0];
      for (Isa isa : IsasHere()) {
        float y = 0;
        GemvInt8(&q[static_cast<size_t>(r) * k], scales.data(), xq, &y, 1, k, isa);
        EXPECT_NEAR(y, expect, 1e-6 * std::max(1.0, std::abs(expect)))
            << IsaName(isa) << " k " << k << " row " << r;
      }
    }
  }
}

// The 16-bit rounding: within half a step (max |x| / 32767 / 2) of x, and
// hi / lo / hi_bias consistent with q, padding zero after a
// longer vector.
TEST(GemvTest, QuantizeActivations16RoundsAndSplits) {
  Int16Activations xq;
  const std::vector<float> long_x = Normal(300, 170);
  std::vector<float> x = Normal(70, 171);
  x[40] = 1000.0f;  // an outlier owns its group
  QuantizeActivations(long_x.data(), 300, xq);
  QuantizeActivations(x.data(), 70, xq);
  ASSERT_EQ(xq.k, 70);
  ASSERT_EQ(xq.q.size(), 128u);
  ASSERT_EQ(xq.scales.size(), 3u);
  ASSERT_EQ(xq.hi_bias.size(), 32u);
  for (int i = 0; i < 128; ++i) {
    if (i >= 70) {
      EXPECT_EQ(xq.q[i], 0) << i;
    }
    EXPECT_EQ(256 * xq.hi[i] + xq.lo[i], xq.q[i]) << i;
    if (i < 70) {
      EXPECT_LE(std::abs(xq.q[i] * xq.scales[i / 32] - x[i]), xq.scales[i / 32] * 0.5f * 1.0001f)
          << i;
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int8_t* v = &xq.hi[4 * lane];
    EXPECT_EQ(xq.hi_bias[lane], -128 * (v[0] + v[1] + v[2] + v[3])) << lane;
  }
}

// A shorter activation vector after a longer one: the buffers are reused and
// the padding is zero again.
TEST(GemvTest, QuantizeActivationsPadsWithZeros) {
  Int8Activations xq;
  const std::vector<float> long_x = Normal(200, 160), short_x = Normal(70, 161);
  QuantizeActivations(long_x.data(), 200, xq);
  QuantizeActivations(short_x.data(), 70, xq);
  ASSERT_EQ(xq.k, 70);
  ASSERT_EQ(xq.q.size(), 128u);
  ASSERT_EQ(xq.scales.size(), 3u);
  ASSERT_EQ(xq.lane_bias.size(), 32u);
  for (int i = 70; i < 128; ++i) EXPECT_EQ(xq.q[i], 0) << i;
  for (int lane = 0; lane < 32; ++lane) {
    const int8_t* v = &xq.q[4 * lane];
    EXPECT_EQ(xq.lane_bias[lane], -128 * (v[0] + v[1] + v[2] + v[3])) << lane;
  }
}

TEST(QuantizeInt8Test, RoundsToNearestWithinHalfAScaleStep) {
  const int n = 5, k = 77;  // groups of 32, 32, 13
  std::vector<float> w = Normal(n * k, 7);
  for (int i = 0; i < k; ++i) w[2 * k + i] = 0.0f;  // an all-zero row
  w[3 * k + 40] = 1000.0f;                          // an outlier owns its group
  std::vector<int8_t> q(w.size());
  std::vector<float> scales(static_cast<size_t>(n * Int8Groups(k)));
  QuantizeInt8(w.data(), n, k, q.data(), scales.data());
  ASSERT_EQ(Int8Groups(k), 3);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      const float s = scales[r * 3 + i / 32];
      const int64_t at = int64_t{r} * k + i;
      EXPECT_GE(q[at], -127);
      EXPECT_LE(std::abs(q[at] * s - w[at]), s * (0.5f + 1e-6f)) << r << "," << i;
    }
  }
  EXPECT_EQ(scales[2 * 3], 0.0f);
  EXPECT_EQ(q[3 * k + 40], 127);
  EXPECT_FLOAT_EQ(scales[3 * 3 + 1], 1000.0f / 127);
}

// The vectorised quantizer gives the bits of the plain definition.
TEST(QuantizeInt8Test, EveryIsaGivesTheBitsOfTheDefinition) {
  for (int k : {5, 32, 77, 768}) {
    const int n = 3;
    std::vector<float> w = Normal(n * k, 8 + k);
    for (int i = 0; i < std::min(k, 32); ++i) w[i] = 0.0f;  // an all-zero group
    std::vector<int8_t> q(w.size());
    std::vector<float> scales(static_cast<size_t>(n * Int8Groups(k)));
    QuantizeInt8(w.data(), n, k, q.data(), scales.data());
    for (int r = 0; r < n; ++r) {
      for (int64_t g = 0; g < Int8Groups(k); ++g) {
        const int begin = static_cast<int>(g * 32), end = std::min<int>(k, begin + 32);
        float max_abs = 0;
        for (int i = begin; i < end; ++i) max_abs = std::max(max_abs, std::abs(w[r * k + i]));
        const float scale = max_abs / 127.0f;
        ASSERT_EQ(scales[r * Int8Groups(k) + g], scale) << k << " " << r << " " << g;
        for (int i = begin; i < end; ++i) {
          const float v = scale > 0 ? std::nearbyint(w[r * k + i] / scale) : 0.0f;
          ASSERT_EQ(q[r * k + i], static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f)))
              << k << " " << r << " " << i;
        }
      }
    }
  }
}

// QuantizeActivations16 (vectorised where the CPU allows) gives the bits of
// its definition: scale max |x| / 32767 per group, x / scale rounded to
// nearest even, clamped.
TEST(QuantizeActivations16Test, GivesTheBitsOfTheDefinition) {
  for (int k : {5, 32, 77, 768}) {
    const int m = 3;
    std::vector<float> x = Normal(m * k, 18 + k);
    for (int i = 0; i < std::min(k, 32); ++i) x[i] = 0.0f;  // an all-zero group
    x[m * k - 1] = -3.0e4f;                                 // a large value owns its group
    std::vector<int16_t> q(x.size());
    std::vector<float> scales(static_cast<size_t>(m * Int8Groups(k)));
    QuantizeActivations16(x.data(), m, k, q.data(), scales.data());
    for (int r = 0; r < m; ++r) {
      for (int64_t g = 0; g < Int8Groups(k); ++g) {
        const int begin = static_cast<int>(g * 32), end = std::min<int>(k, begin + 32);
        float max_abs = 0;
        for (int i = begin; i < end; ++i) max_abs = std::max(max_abs, std::abs(x[r * k + i]));
        const float scale = max_abs / 32767.0f;
        ASSERT_EQ(scales[r * Int8Groups(k) + g], scale) << k << " " << r << " " << g;
        for (int i = begin; i < end; ++i) {
          const float v = scale > 0 ? std::nearbyint(x[r * k + i] / scale) : 0.0f;
          ASSERT_EQ(q[r * k + i], static_cast<int16_t>(std::clamp(v, -32767.0f, 32767.0f)))
              << k << " " << r << " " << i;
        }
      }
    }
  }
}

// The stored matrix through WeightMatrix::MatMul (GEMV at m == 1, blocked
// sgemm or GEMVs of many vectors up to kManyGemvRows rows, the panel or int8
// GEMM above; 1 and 2 threads, and 2 on a WorkPool) gives the product of its
// own values (and for int8, of x rounded to 16 bits, or above kManyGemvRows
// rows to 8).
TEST(WeightMatrixTest, MatMulOfEveryStorageMatchesItsValues) {
  uint32_t seed = 200;
  WorkPool pool(2);
  for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBf16, WeightDtype::kInt8}) {
    for (int m : {1, 2, 5, 17, kManyGemvRows + 6}) {
      for (int n : {1, 7, 64, 131}) {
        for (int k : {1, 13, 96, 777}) {
          const std::vector<float> w = Normal(int64_t{n} * k, ++seed);
          const std::vector<float> x = Normal(int64_t{m} * k, ++seed);
          const WeightMatrix mat = WeightMatrix::FromF32(w, n, k, dtype);
          ASSERT_EQ(mat.rows(), n);
          ASSERT_EQ(mat.cols(), k);
          std::vector<float> stored(w.size());
          mat.RowsToFloat(0, n, stored.data());
          const bool int8 = dtype == WeightDtype::kInt8;
          const Reference ref = Exact(stored,
                                      !int8               ? x
                                      : m > kManyGemvRows ? RoundedActivations(x, m, k)
                                                          : Rounded16(x, m, k),
                                      m, n, k);
          for (int threads : {1, 2, 3}) {
            // threads 3: 2 on the pool.
            std::vector<float> y(static_cast<size_t>(m) * n, std::nanf(""));
            mat.MatMul(x.data(), y.data(), m, std::min(threads, 2), threads == 3 ? &pool : nullptr);
            for (size_t i = 0; i < y.size(); ++i) {
              ASSERT_LE(std::abs(y[i] - ref.y[i]), 2 * ref.bound[i])
                  << WeightDtypeName(dtype) << " m " << m << " n " << n << " k " << k << " threads "
                  << threads << " at " << i;
            }
          }
        }
      }
    }
  }
}

// The int8 and w8a8 GEMV and GEMM against the fp32 matrix and activations:
// within half a scale step per weight, and for w8a8 half a step per
// activation too (the bounds in the file comment).
TEST(WeightMatrixTest, QuantizedMatMulIsWithinHalfAStepOfFp32) {
  const int n = 96, k = 768;
  const std::vector<float> w = Normal(int64_t{n} * k, 300);
  for (WeightDtype dtype : {WeightDtype::kInt8, WeightDtype::kW8A8}) {
    const WeightMatrix mat = WeightMatrix::FromF32(w, n, k, dtype);
    const bool w8a8 = dtype == WeightDtype::kW8A8;
    std::vector<float> stored(w.size());
    mat.RowsToFloat(0, n, stored.data());
    for (int m : {1, 16, kManyGemvRows + 1}) {
      const bool x8 = w8a8 || m > kManyGemvRows;
      const std::vector<float> x = Normal(int64_t{m} * k, 301 + m);
      const Reference ref = Exact(w, x, m, n, k);
      std::vector<float> y(static_cast<size_t>(m) * n);
      mat.MatMul(x.data(), y.data(), m, 2);
      double worst = 0;
      for (int i = 0; i < m; ++i) {
        const float* xi = &x[int64_t{i} * k];
        for (int r = 0; r < n; ++r) {
          // Each group's scale is max |value| / 127 over the group.
          double bound = 0;
          for (int64_t g = 0; g < Int8Groups(k); ++g) {
            const int begin = static_cast<int>(g * 32), end = std::min<int>(k, begin + 32);
            float w_max = 0, x_max = 0;
            for (int c = begin; c < end; ++c) {
              w_max = std::max(w_max, std::abs(w[int64_t{r} * k + c]));
              x_max = std::max(x_max, std::abs(xi[c]));
            }
            for (int c = begin; c < end; ++c) {
              // int8 rounds x to 16 bits (max / 32767) up to kManyGemvRows
              // rows, to 8 above; w8a8 always to 8 (max / 127).
              bound +=
                  std::abs(double{xi[c]}) * (w_max / 127) / 2 +
                  std::abs(double{stored[int64_t{r} * k + c]}) * (x_max / (x8 ? 127 : 32767)) / 2;
            }
          }
          const int64_t at = int64_t{i} * n + r;
          const double err = std::abs(y[at] - ref.y[at]);
          EXPECT_LE(err, bound + 2 * ref.bound[at])
              << WeightDtypeName(dtype) << " m " << m << " row " << r;
          worst = std::max(worst, err / std::max(1e-30, bound));
        }
      }
      // Rounding errors of independent values cancel: far below the bound.
      EXPECT_LT(worst, 0.5) << WeightDtypeName(dtype) << " m " << m;
    }
  }
}

// int8 and w8a8 through WeightMatrix::MatMul: the GEMV (m == 1) and the GEMM
// (m > 1) both give the product of the stored weights and the rounded
// activations (16-bit for int8 up to kManyGemvRows rows, 8-bit for int8
// above and for w8a8), without a pool (OpenMP) and on a WorkPool.
TEST(WeightMatrixTest, Int8MatMulMatchesItsRoundedValues) {
  uint32_t seed = 250;
  WorkPool pool(2);
  for (WeightDtype dtype : {WeightDtype::kInt8, WeightDtype::kW8A8}) {
    for (int m : {1, 2, 17, kManyGemvRows + 1, 70}) {
      for (int n : {1, 7, 64, 131}) {
        for (int k : {1, 13, 96, 777}) {
          const std::vector<float> w = Normal(int64_t{n} * k, ++seed);
          const std::vector<float> x = Normal(int64_t{m} * k, ++seed);
          const WeightMatrix mat = WeightMatrix::FromF32(w, n, k, dtype);
          ASSERT_EQ(mat.storage(), WeightMatrix::Storage::kInt8);
          ASSERT_EQ(mat.quantize_activations(), dtype == WeightDtype::kW8A8);
          std::vector<float> stored(w.size());
          mat.RowsToFloat(0, n, stored.data());
          const bool x8 = dtype == WeightDtype::kW8A8 || m > kManyGemvRows;
          const Reference ref =
              Exact(stored, x8 ? RoundedActivations(x, m, k) : Rounded16(x, m, k), m, n, k);
          for (int threads : {1, 2, 3}) {
            // threads 3: 2 on the pool.
            std::vector<float> y(static_cast<size_t>(m) * n, std::nanf(""));
            mat.MatMul(x.data(), y.data(), m, std::min(threads, 2), threads == 3 ? &pool : nullptr);
            for (size_t i = 0; i < y.size(); ++i) {
              ASSERT_LE(std::abs(y[i] - ref.y[i]), 2 * ref.bound[i])
                  << WeightDtypeName(dtype) << " m " << m << " n " << n << " k " << k << " threads "
                  << threads << " at " << i;
            }
          }
        }
      }
    }
  }
}

// Matrices of more than 1 MiB (the huge-page mapping) through the WorkPool
// GEMV, whose chunks end inside the last row group, and without a pool.
TEST(WeightMatrixTest, LargeMatricesOnAWorkPoolMatchTheirValues) {
  WorkPool pool(3);
  const int n = 1500, k = 777;  // fp32 4.7 MB, bf16 2.3 MB, int8 1.3 MB
  const std::vector<float> w = Normal(int64_t{n} * k, 500);
  const std::vector<float> x = Normal(k, 501);
  for (WeightDtype dtype :
       {WeightDtype::kF32, WeightDtype::kBf16, WeightDtype::kInt8, WeightDtype::kW8A8}) {
    const WeightMatrix mat = WeightMatrix::FromF32(w, n, k, dtype);
    std::vector<float> stored(w.size());
    mat.RowsToFloat(0, n, stored.data());
    const Reference ref = dtype == WeightDtype::kW8A8
                              ? Exact(stored, RoundedActivations(x, 1, k), 1, n, k)
                          : dtype == WeightDtype::kInt8 ? Exact(stored, Rounded16(x, 1, k), 1, n, k)
                                                        : Exact(stored, x, 1, n, k);
    for (WorkPool* p : {&pool, static_cast<WorkPool*>(nullptr)}) {
      std::vector<float> y(static_cast<size_t>(n), std::nanf(""));
      mat.MatMul(x.data(), y.data(), 1, 2, p);
      for (int r = 0; r < n; ++r) {
        ASSERT_LE(std::abs(y[r] - ref.y[r]), 2 * ref.bound[r])
            << WeightDtypeName(dtype) << (p ? " pool" : " no pool") << " row " << r;
      }
    }
  }
}

TEST(WeightMatrixTest, StorageFollowsTheRequestedDtype) {
  const std::vector<float> exact = Normal(64 * 32, 400, /*bf16_exact=*/true);
  const std::vector<float> inexact = Normal(64 * 32, 401);
  EXPECT_EQ(WeightMatrix::FromF32(exact, 64, 32, WeightDtype::kAuto).storage(),
            WeightMatrix::Storage::kBf16);
  EXPECT_EQ(WeightMatrix::FromF32(inexact, 64, 32, WeightDtype::kAuto).storage(),
            WeightMatrix::Storage::kF32);
  EXPECT_EQ(WeightMatrix::FromF32(exact, 64, 32, WeightDtype::kF32).storage(),
            WeightMatrix::Storage::kF32);

  const WeightMatrix f32 = WeightMatrix::FromF32(inexact, 64, 32, WeightDtype::kF32);
  const WeightMatrix bf16 = WeightMatrix::FromF32(inexact, 64, 32, WeightDtype::kBf16);
  const WeightMatrix int8 = WeightMatrix::FromF32(inexact, 64, 32, WeightDtype::kInt8);
  EXPECT_EQ(f32.bytes(), 64 * 32 * 4);
  EXPECT_EQ(bf16.bytes(), 64 * 32 * 2);
  EXPECT_EQ(int8.bytes(), 64 * 32 + 64 * 4);  // one fp32 scale per 32 values
  // bf16 rounds to nearest even.
  std::vector<float> row(32);
  bf16.RowsToFloat(5, 1, row.data());
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(row[i], engine::Bf16ToFloat(FloatToBf16(inexact[5 * 32 + i])));
}

TEST(WeightMatrixTest, FromRawReadsCheckpointDtypes) {
  const int rows = 3, cols = 40;
  const std::vector<float> values = Normal(rows * cols, 500, /*bf16_exact=*/true);
  std::vector<uint16_t> bf16(values.size()), f16(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bf16[i] = FloatToBf16(values[i]);
    f16[i] = FloatToHalf(values[i]);
  }
  const auto bytes_of = [](const auto& v) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()),
                                      v.size() * sizeof(v[0]));
  };
  for (WeightDtype dtype : {WeightDtype::kAuto, WeightDtype::kF32, WeightDtype::kBf16,
                            WeightDtype::kInt8, WeightDtype::kW8A8, WeightDtype::kInt4}) {
    const WeightMatrix want = WeightMatrix::FromF32(values, rows, cols, dtype);
    std::vector<float> want_rows(values.size()), got_rows(values.size());
    want.RowsToFloat(0, rows, want_rows.data());
    for (const auto& [src, bytes] :
         {std::pair{StDtype::kF32, bytes_of(values)}, std::pair{StDtype::kBF16, bytes_of(bf16)}}) {
      absl::StatusOr<WeightMatrix> got = WeightMatrix::FromRaw(src, bytes, rows, cols, dtype);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->storage(), want.storage()) << WeightDtypeName(dtype);
      got->RowsToFloat(0, rows, got_rows.data());
      EXPECT_EQ(got_rows, want_rows) << WeightDtypeName(dtype) << " from " << StDtypeName(src);
    }
    absl::StatusOr<WeightMatrix> half =
        WeightMatrix::FromRaw(StDtype::kF16, bytes_of(f16), rows, cols, WeightDtype::kF32);
    ASSERT_TRUE(half.ok()) << half.status();
    half->RowsToFloat(0, rows, got_rows.data());
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(got_rows[i], HalfToFloat(f16[i]));
  }
  EXPECT_FALSE(
      WeightMatrix::FromRaw(StDtype::kBF16, bytes_of(bf16), rows, cols + 1, WeightDtype::kAuto)
          .ok());
  EXPECT_FALSE(
      WeightMatrix::FromRaw(StDtype::kI16, bytes_of(bf16), rows, cols, WeightDtype::kAuto).ok());
}

TEST(WeightDtypeTest, NamesRoundTripAndUnknownNamesAreRefused) {
  for (WeightDtype dtype : {WeightDtype::kAuto, WeightDtype::kF32, WeightDtype::kBf16,
                            WeightDtype::kInt8, WeightDtype::kW8A8, WeightDtype::kInt4}) {
    absl::StatusOr<WeightDtype> parsed = ParseWeightDtype(WeightDtypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
    WeightDtype flag = WeightDtype::kAuto;
    std::string error;
    EXPECT_TRUE(AbslParseFlag(AbslUnparseFlag(dtype), &flag, &error)) << error;
    EXPECT_EQ(flag, dtype);
  }
  EXPECT_EQ(ParseWeightDtype("fp16").status().code(), absl::StatusCode::kInvalidArgument);
  WeightDtype flag = WeightDtype::kF32;
  std::string error;
  EXPECT_FALSE(AbslParseFlag("int2", &flag, &error));
  EXPECT_NE(error.find("auto, f32, bf16, int8, w8a8, int4"), std::string::npos) << error;
  EXPECT_EQ(flag, WeightDtype::kF32);
}

}  // namespace
}  // namespace pdserve::engine::cpu
