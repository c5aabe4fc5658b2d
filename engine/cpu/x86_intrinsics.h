// <immintrin.h> for the CPU kernels, on x86-64 only. GCC 12's AVX-512
// headers trip -Wmaybe-uninitialized and -Wuninitialized on their own
// placeholder operands (GCC bug 105593); the kernels read nothing
// uninitialised, so an including file has both warnings off.
#pragma once

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

namespace pdserve::engine::cpu {

// The sum of an AVX2 vector's 8 lanes, always in this order (the two
// halves, then pairs, then the last two): every AVX2 kernel that reduces a
// vector to one value goes through it, so their sums agree bit for bit.
__attribute__((target("avx2"))) inline float HorizontalSum8(__m256 v) {
  const __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// Lane r of the result is HorizontalSum8(v[r]), bit for bit: the same tree
// for 8 vectors at once (a transpose of 7 adds and 14 shuffles and
// permutes, against 8 separate trees of 3 adds and 3 shuffles each).
__attribute__((target("avx2"))) inline __m256 HorizontalSums8(const __m256 (&v)[8]) {
  __m256 s4[4], s2[2];
  for (int i = 0; i < 4; ++i) {  // lanes 0-3: v[2i][j] + v[2i][j + 4]; 4-7: v[2i + 1]'s
    const __m256 a = v[2 * i], b = v[2 * i + 1];
    s4[i] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  for (int i = 0; i < 2; ++i) {  // each half: lanes j and j + 2 of two vectors, 2 lanes each
    const __m256 a = s4[2 * i], b = s4[2 * i + 1];
    s2[i] = _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xEE));
  }
  // Lanes 0-3: the sums of v[0], v[2], v[4], v[6]; lanes 4-7: v[1], v[3], v[5], v[7].
  const __m256 sums =
      _mm256_add_ps(_mm256_shuffle_ps(s2[0], s2[1], 0x88), _mm256_shuffle_ps(s2[0], s2[1], 0xDD));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace pdserve::engine::cpu
#endif
