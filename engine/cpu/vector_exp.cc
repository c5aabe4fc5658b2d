// exp of many floats: see vector_exp.h.
#include "engine/cpu/vector_exp.h"

#include <cmath>

#include "engine/cpu/kernels_gemv.h"
#include "engine/cpu/x86_intrinsics.h"

namespace pdserve::engine::cpu {
namespace {

#if defined(__x86_64__)
// glibc's __exp2f_data: tab[i] = bits of 2^(i / 32) - (i << 47), and the
// scaled constants of e_expf.c (N = 32).
alignas(64) constexpr uint64_t kTable[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
constexpr double kInvLn2N = 0x1.71547652b82fep+0 * 32;  // 32 / ln 2
constexpr double kShift = 0x1.8p+52;
constexpr double kC0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / 32;

#define PDSERVE_EXP_AVX512 __attribute__((target("avx512f")))

// e_expf.c's main path for 8 values, |x| < 88 (abstop <= 0x42a):
//   z = x * 32/ln2 = k + r, k rounded to nearest by the shift;
//   exp(x) = 2^(k/32) * (C0 r^3 + C1 r^2 + C2 r + 1), 2^(k/32) from the table.
PDSERVE_EXP_AVX512 inline __m256 Exp8(__m256 x) {
  const __m512d xd = _mm512_cvtps_pd(x);
  const __m512d inv_ln2n = _mm512_set1_pd(kInvLn2N), shift = _mm512_set1_pd(kShift);
  const __m512d shifted = _mm512_fmadd_pd(inv_ln2n, xd, shift);
  const __m512i ki = _mm512_castpd_si512(shifted);
  const __m512d kd = _mm512_sub_pd(shifted, shift);
  const __m512d r = _mm512_fmsub_pd(inv_ln2n, xd, kd);
  const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(kC0), _mm512_set1_pd(kC1));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(kC2), _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(z, r2, y);
  // tab[ki % 32]: entries 0-15 and 16-31 by two permutes, bit 4 picks.
  const __m512i lo =
      _mm512_permutex2var_epi64(_mm512_load_si512(kTable), ki, _mm512_load_si512(kTable + 8));
  const __m512i hi =
      _mm512_permutex2var_epi64(_mm512_load_si512(kTable + 16), ki, _mm512_load_si512(kTable + 24));
  const __mmask8 upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
  const __m512i t =
      _mm512_add_epi64(_mm512_mask_blend_epi64(upper, lo, hi), _mm512_slli_epi64(ki, 47));
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}

PDSERVE_EXP_AVX512 void ExpFloatsAvx512(const float* in, float* out, int64_t n) {
  const __m512i exponent_mask = _mm512_set1_epi32(0x7ff), limit = _mm512_set1_epi32(0x42a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    // e_expf.c's abstop: bits 20-30 of the float; above 0x42a, |x| >= 88 or
    // not finite, its special cases.
    const __m512i abstop =
        _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), exponent_mask);
    if (_mm512_cmpgt_epi32_mask(abstop, limit) != 0) {
      for (int64_t j = i; j < i + 16; ++j) out[j] = std::exp(in[j]);
      continue;
    }
    const __m256 lo = Exp8(_mm512_castps512_ps256(x));
    const __m256 hi = Exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    _mm512_storeu_ps(
        out + i, _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                                     _mm256_castps_pd(hi), 1)));
  }
  for (; i < n; ++i) out[i] = std::exp(in[i]);
}

#define PDSERVE_EXP_AVX2 __attribute__((target("avx2,fma")))

// Exp8's operations on 4 values in double precision, the table read by a
// gather.
PDSERVE_EXP_AVX2 inline __m128 Exp4Avx2(__m128 x) {
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d inv_ln2n = _mm256_set1_pd(kInvLn2N), shift = _mm256_set1_pd(kShift);
  const __m256d shifted = _mm256_fmadd_pd(inv_ln2n, xd, shift);
  const __m256i ki = _mm256_castpd_si256(shifted);
  const __m256d kd = _mm256_sub_pd(shifted, shift);
  const __m256d r = _mm256_fmsub_pd(inv_ln2n, xd, kd);
  const __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(kC0), _mm256_set1_pd(kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(kC2), _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  const __m256i index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  const __m256i entry =
      _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kTable), index, 8);
  const __m256i t = _mm256_add_epi64(entry, _mm256_slli_epi64(ki, 47));
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

PDSERVE_EXP_AVX2 void ExpFloatsAvx2(const float* in, float* out, int64_t n) {
  const __m256i exponent_mask = _mm256_set1_epi32(0x7ff), limit = _mm256_set1_epi32(0x42a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    const __m256i abstop =
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), exponent_mask);
    if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(abstop, limit)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) out[j] = std::exp(in[j]);
      continue;
    }
    const __m128 lo = Exp4Avx2(_mm256_castps256_ps128(x));
    const __m128 hi = Exp4Avx2(_mm256_extractf128_ps(x, 1));
    _mm256_storeu_ps(out + i, _mm256_set_m128(hi, lo));
  }
  for (; i < n; ++i) out[i] = std::exp(in[i]);
}
#endif

}  // namespace

void ExpFloats(const float* in, float* out, int64_t n) {
#if defined(__x86_64__)
  if (BestIsa() == Isa::kAvx512) return ExpFloatsAvx512(in, out, n);
  if (BestIsa() == Isa::kAvx2) return ExpFloatsAvx2(in, out, n);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(in[i]);
}

}  // namespace pdserve::engine::cpu
