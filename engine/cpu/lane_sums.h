// Lane sums of AVX-512 vectors in one fixed order, for the kernels that end
// a dot product with a horizontal sum (kernels.cc, kernels_gemv.cc). The sum
// of a vector's 16 lanes is the tree
//   h[j] = (v[j] + v[j + 8]) + (v[j + 4] + v[j + 12])   for j < 4,
//   sum  = (h[0] + h[2]) + (h[1] + h[3]),
// the order of GCC's _mm512_reduce_add_ps, written out so that it does not
// depend on the compiler. SumLanes16 takes the sums of 16 vectors at once in
// that same order, bit for bit, with a transpose of 15 vector adds and 31
// shuffles instead of 16 separate trees (about 8 shuffles and adds each):
// what a loop of short dot products (one weight row of the demo model's 256
// columns, one 32-wide attention head) spends much of its time on.
// Internal to the CPU backend; x86-64 with AVX-512 F only.
#pragma once

#include "engine/cpu/x86_intrinsics.h"

#if defined(__x86_64__)
namespace pdserve::engine::cpu {

#define PDSERVE_LANE_SUMS_AVX512 __attribute__((target("avx512f")))

PDSERVE_LANE_SUMS_AVX512 inline float SumLanes(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 t8 = _mm256_add_ps(hi, lo);  // v[j] + v[j + 8]
  const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));  // h
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));  // h[0] + h[2], h[1] + h[3]
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// Lane r of the result is SumLanes(v[r]), bit for bit.
PDSERVE_LANE_SUMS_AVX512 inline __m512 SumLanes16(const __m512 (&v)[16]) {
  // Each stage adds pairs of half-vectors: a vector's lanes j and j + 8, then
  // j and j + 4 of those, then j and j + 2, then j and j + 1, the pairs of
  // two vectors packed into one add.
  __m512 s8[8], s4[4], s2[2];
  for (int i = 0; i < 8; ++i) {  // quarters 0-1: v[2i], 2-3: v[2i + 1]
    const __m512 a = v[2 * i], b = v[2 * i + 1];
    s8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0xEE), _mm512_shuffle_f32x4(a, b, 0x44));
  }
  for (int i = 0; i < 4; ++i) {  // quarter q: v[4i + q]
    const __m512 a = s8[2 * i], b = s8[2 * i + 1];
    s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0xDD), _mm512_shuffle_f32x4(a, b, 0x88));
  }
  for (int i = 0; i < 2; ++i) {  // quarter q: v[8i + q] twice, then v[8i + 4 + q] twice
    const __m512 a = s4[2 * i], b = s4[2 * i + 1];
    s2[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
  }
  // Lane 4 q + i holds the sum of v[q + 4 i].
  const __m512 sums =
      _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], 0x88), _mm512_shuffle_ps(s2[0], s2[1], 0xDD));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, sums);
}

}  // namespace pdserve::engine::cpu
#endif
