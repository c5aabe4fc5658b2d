// The AVX-512 fp32 / bf16 panel GEMM of kernels_gemm_float.h against the
// float64 product, over shapes with every kind of tail: rows not a multiple
// of a 16-row panel, a panel pair or a 128-row chunk; columns not a multiple
// of the 256-column block; 1 to 13 activation rows (every count of the
// 12-row pass and its remainder) and a few larger counts; a y wider than n,
// whose extra columns must stay untouched.
#include <cmath>
#include <vector>

#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_gemm_float.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/gemv_reference.h"

namespace pdserve::engine::cpu {
namespace {

using testing_gemv::Exact;
using testing_gemv::Normal;
using testing_gemv::Reference;

TEST(GemmFloatPanelsTest, F32AndBf16MatchTheExactProduct) {
  if (!HasFloatGemmPanels()) GTEST_SKIP() << "no AVX-512 here: MatMul uses sgemm";
  uint32_t seed = 2000;
  for (int n : {1, 15, 16, 17, 33, 48, 127, 128, 129, 300}) {
    for (int k : {1, 7, 255, 256, 257, 600}) {
      for (int m : {1, 2, 5, 11, 12, 13, 25, 70}) {
        if (m > 13 && n != 129 && n != 33) continue;  // bounded run time
        const std::vector<float> w = Normal(int64_t{n} * k, ++seed, /*bf16_exact=*/true);
        const std::vector<float> x = Normal(int64_t{m} * k, ++seed);
        const std::vector<uint16_t> w16 = ToBf16(w.data(), static_cast<int64_t>(w.size()));
        const Reference ref = Exact(w, x, m, n, k);
        const int64_t ldy = n + 5;
        for (bool bf16 : {false, true}) {
          std::vector<float> y(static_cast<size_t>(m * ldy), -3.0f);
          if (bf16) {
            GemmBf16Panels(w16.data(), n, k, x.data(), k, m, y.data(), ldy);
          } else {
            GemmF32Panels(w.data(), n, k, x.data(), k, m, y.data(), ldy);
          }
          for (int t = 0; t < m; ++t) {
            for (int r = 0; r < ldy; ++r) {
              const float got = y[t * ldy + r];
              if (r >= n) {
                ASSERT_EQ(got, -3.0f) << "wrote past row " << n;
                continue;
              }
              const int64_t at = int64_t{t} * n + r;
              ASSERT_LE(std::abs(got - ref.y[at]), ref.bound[at])
                  << (bf16 ? "bf16 " : "f32 ") << m << "x" << n << "x" << k << " at " << t << ","
                  << r;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::engine::cpu
