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

}  // namespace pdserve::engine::cpu
#endif
