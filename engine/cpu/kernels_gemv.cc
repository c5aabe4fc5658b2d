// Weight-streaming GEMV kernels; see kernels_gemv.h for the contracts.
#include "engine/cpu/kernels_gemv.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cpu/count_dispatch.h"
#include "engine/cpu/lane_sums.h"
#include "engine/cpu/x86_intrinsics.h"

namespace pdserve::engine::cpu {
namespace {

float Bf16Value(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// ---- portable reference ----

void GemvF32Portable(const float* w, const float* x, float* y, int n, int k) {
  for (int r = 0; r < n; ++r) {
    const float* row = w + int64_t{r} * k;
    float sum = 0;
    for (int i = 0; i < k; ++i) sum += row[i] * x[i];
    y[r] = sum;
  }
}

void GemvBf16Portable(const uint16_t* w, const float* x, float* y, int n, int k) {
  for (int r = 0; r < n; ++r) {
    const uint16_t* row = w + int64_t{r} * k;
    float sum = 0;
    for (int i = 0; i < k; ++i) sum += Bf16Value(row[i]) * x[i];
    y[r] = sum;
  }
}

// y[r] = sum over groups g of scales[r, g] * group_sum(row r, g, begin, end),
// for the portable int8 kernels.
template <typename GroupSum>
void Int8RowsPortable(const int8_t* q, const float* scales, float* y, int n, int k,
                      GroupSum group_sum) {
  const int64_t groups = Int8Groups(k);
  for (int r = 0; r < n; ++r) {
    const int8_t* row = q + int64_t{r} * k;
    const float* s = scales + r * groups;
    float sum = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int begin = static_cast<int>(g * kInt8Group);
      sum += s[g] * group_sum(row, g, begin, std::min(k, begin + kInt8Group));
    }
    y[r] = sum;
  }
}

void GemvInt8Portable(const int8_t* q, const float* scales, const Int16Activations& x, float* y,
                      int n, int k) {
  Int8RowsPortable(q, scales, y, n, k, [&x](const int8_t* row, int64_t g, int begin, int end) {
    int32_t dot = 0;  // at most 32 * 127 * 32767 in magnitude: exact
    for (int i = begin; i < end; ++i) dot += row[i] * x.q[i];
    return x.scales[g] * static_cast<float>(dot);
  });
}

void GemvInt8ActPortable(const int8_t* q, const float* scales, const Int8Activations& x, float* y,
                         int n, int k) {
  Int8RowsPortable(q, scales, y, n, k, [&x](const int8_t* row, int64_t g, int begin, int end) {
    int32_t dot = 0;
    for (int i = begin; i < end; ++i) dot += row[i] * x.q[i];
    return x.scales[g] * static_cast<float>(dot);
  });
}

// Rows of k values in groups of 32: scale = max |value| / limit (0 for an
// all-zero group), q = value / scale rounded to nearest, clamped to
// [-limit, limit]. QuantizeInt8 (limit 127, int8) and QuantizeActivations16
// (limit 32767, int16).
template <typename T>
void QuantizeGroupsPortable(const float* w, int64_t n, int64_t k, float limit, T* q,
                            float* scales) {
  const int64_t groups = Int8Groups(k);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = r * k + g * kInt8Group, end = r * k + std::min(k, (g + 1) * kInt8Group);
      float max_abs = 0;
      for (int64_t i = begin; i < end; ++i) max_abs = std::max(max_abs, std::abs(w[i]));
      const float scale = max_abs / limit;
      scales[r * groups + g] = scale;
      for (int64_t i = begin; i < end; ++i) {
        const float v = scale > 0 ? std::nearbyint(w[i] / scale) : 0.0f;
        q[i] = static_cast<T>(std::clamp(v, -limit, limit));
      }
    }
  }
}

#if defined(__x86_64__)
#define PDSERVE_AVX2 __attribute__((target("avx2,fma")))
#define PDSERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

// ---- AVX2 + FMA: 8 lanes ----

// Loaders of 8 weights as fp32, for GemvAvx2.
struct F32x8 {
  PDSERVE_AVX2 static __m256 Load(const float* p) { return _mm256_loadu_ps(p); }
  static float Value(float v) { return v; }
};
struct Bf16x8 {
  PDSERVE_AVX2 static __m256 Load(const uint16_t* p) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
  static float Value(uint16_t v) { return Bf16Value(v); }
};

// Rows walked together by the AVX2 batch-1 kernels, one from each part of
// their rows (r, r + n / 4, ...): four ascending address streams read 20
// GB/s from memory on a Zen 3 EPYC guest where one read 11 and two 16
// (docs/performance.md); each row is still summed exactly as alone.
constexpr int kStreams = 4;

// A row's sum from its four accumulators and its k % 8 last products.
template <typename Loader, typename T>
PDSERVE_AVX2 inline float FinishRowAvx2(const T* row, const float* x, int k, const __m256 (&a)[4]) {
  float sum = HorizontalSum8(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
  for (int j = k / 8 * 8; j < k; ++j) sum += Loader::Value(row[j]) * x[j];
  return sum;
}

// fp32 or bf16 rows: S rows `stride` rows apart at a time, 32 columns per
// iteration, four accumulators per row.
template <typename Loader, typename T, int S>
PDSERVE_AVX2 inline void RowsAvx2(const T* w, const float* x, float* y, int64_t stride, int k) {
  const int k32 = k / 32 * 32, k8 = k / 8 * 8;
  __m256 a[S][4];
#pragma GCC unroll 4
  for (int q = 0; q < S; ++q) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) a[q][u] = _mm256_setzero_ps();
  }
  int i = 0;
  for (; i < k32; i += 32) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m256 xv = _mm256_loadu_ps(x + i + 8 * u);
#pragma GCC unroll 4
      for (int q = 0; q < S; ++q) {
        a[q][u] = _mm256_fmadd_ps(Loader::Load(w + q * stride * k + i + 8 * u), xv, a[q][u]);
      }
    }
  }
  for (; i < k8; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
#pragma GCC unroll 4
    for (int q = 0; q < S; ++q) {
      a[q][0] = _mm256_fmadd_ps(Loader::Load(w + q * stride * k + i), xv, a[q][0]);
    }
  }
#pragma GCC unroll 4
  for (int q = 0; q < S; ++q) y[q * stride] = FinishRowAvx2<Loader>(w + q * stride * k, x, k, a[q]);
}

template <typename Loader, typename T>
PDSERVE_AVX2 void GemvAvx2(const T* w, const float* x, float* y, int n, int k) {
  const int part = n / kStreams;
  for (int r = 0; r < part; ++r) {
    RowsAvx2<Loader, T, kStreams>(w + int64_t{r} * k, x, y + r, part, k);
  }
  for (int r = kStreams * part; r < n; ++r) {
    RowsAvx2<Loader, T, 1>(w + int64_t{r} * k, x, y + r, 0, k);
  }
}

// Bytes ahead of the current group or chunk the int8 kernels (GemvInt8Avx2,
// GemvVnni) prefetch.
constexpr int kInt8Prefetch = 4096;

// GemvInt8 with AVX2: per group of 32, the weights widened to int16 and
// multiplied by x.q in pairs (vpmaddwd: two products of at most 127 * 32767
// summed, exact in int32), the 8 lane sums converted to fp32 and scaled by
// (weight scale * activation scale). A short last group runs the portable
// sum. kInt8Streams rows are walked together, as in GemvAvx2: two, since
// each row brings its scales as a second stream (four rows measured no
// faster than two).
struct Int8RowAvx2 {
  const int8_t* row;
  const float* s;
  __m256 acc0, acc1;
};

// Group g (full) of one row into its accumulators.
PDSERVE_AVX2 inline void Int8GroupAvx2(Int8RowAvx2& r, const Int16Activations& x, int g) {
  const int i = g * kInt8Group;
  // One cache line per two groups, 4 KiB ahead (as GemvVnni).
  if (g % 2 == 0) {
    _mm_prefetch(reinterpret_cast<const char*>(r.row + i) + kInt8Prefetch, _MM_HINT_T0);
  }
  const int16_t* xq = x.q.data();
  const __m256i w0 =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.row + i)));
  const __m256i w1 =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.row + i + 16)));
  const __m256i dot = _mm256_add_epi32(
      _mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i))),
      _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i + 16))));
  const __m256 scale = _mm256_set1_ps(r.s[g] * x.scales[g]);
  if (g % 2 == 0) {
    r.acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, r.acc0);
  } else {
    r.acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, r.acc1);
  }
}

// The row's sum: its accumulators, then a short last group.
PDSERVE_AVX2 inline float Int8FinishAvx2(const Int8RowAvx2& r, const Int16Activations& x, int k) {
  const int full = k / kInt8Group;
  float sum = HorizontalSum8(_mm256_add_ps(r.acc0, r.acc1));
  if (full < Int8Groups(k)) {
    int32_t dot = 0;
    for (int i = full * kInt8Group; i < k; ++i) dot += r.row[i] * x.q[i];
    sum += r.s[full] * (x.scales[full] * static_cast<float>(dot));
  }
  return sum;
}

PDSERVE_AVX2 void GemvInt8Avx2(const int8_t* q, const float* scales, const Int16Activations& x,
                               float* y, int n, int k) {
  const int64_t groups = Int8Groups(k);
  const int full = k / kInt8Group;  // groups without a tail
  constexpr int kInt8Streams = 2;
  const int part = n / kInt8Streams;
  const __m256 zero = _mm256_setzero_ps();
  const auto row_at = [&](int r) {
    return Int8RowAvx2{q + int64_t{r} * k, scales + r * groups, zero, zero};
  };
  for (int r = 0; r < part; ++r) {
    Int8RowAvx2 rows[kInt8Streams];
    for (int s = 0; s < kInt8Streams; ++s) rows[s] = row_at(r + s * part);
    for (int g = 0; g < full; ++g) {
#pragma GCC unroll 4
      for (int s = 0; s < kInt8Streams; ++s) Int8GroupAvx2(rows[s], x, g);
    }
    for (int s = 0; s < kInt8Streams; ++s) y[r + s * part] = Int8FinishAvx2(rows[s], x, k);
  }
  for (int r = kInt8Streams * part; r < n; ++r) {
    Int8RowAvx2 a = row_at(r);
    for (int g = 0; g < full; ++g) Int8GroupAvx2(a, x, g);
    y[r] = Int8FinishAvx2(a, x, k);
  }
}

// ---- AVX-512 F + BW: 16 lanes, masked tails ----

// Lanes [0, count) set, count in [0, 16].
PDSERVE_AVX512 inline __mmask16 TailMask(int count) {
  return static_cast<__mmask16>((1u << count) - 1);
}

// Loaders of 16 weights as fp32 (the lanes of `mask` only, others 0), for
// GemvAvx512.
struct F32x16 {
  static constexpr int kUnroll = 2;
  PDSERVE_AVX512 static __m512 Load(const float* p) { return _mm512_loadu_ps(p); }
  PDSERVE_AVX512 static __m512 Load(const float* p, __mmask16 mask) {
    return _mm512_maskz_loadu_ps(mask, p);
  }
};
struct Bf16x16 {
  static constexpr int kUnroll = 4;
  PDSERVE_AVX512 static __m512 Widen(__m256i raw) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
  PDSERVE_AVX512 static __m512 Load(const uint16_t* p) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  PDSERVE_AVX512 static __m512 Load(const uint16_t* p, __mmask16 mask) {
    return Widen(_mm256_maskz_loadu_epi16(mask, p));
  }
};
// fp32 or bf16 rows: one row at a time, Loader::kUnroll vectors of 16
// columns per iteration, one accumulator each. fp32 streams fastest with two
// (a 128-byte step), bf16 with four (also 128 bytes): in a scratch
// microbenchmark over the decode matrices of docs/performance.md, fp32 with
// four accumulators streamed about 10% slower than with two. Each row's
// accumulators end in one vector whose lanes sum to y[r]; those sums are taken
// 16 rows at a time (SumLanes16, lane_sums.h), the same numbers as one row's
// SumLanes at about a quarter of the shuffles and adds.
template <typename Loader, typename T>
PDSERVE_AVX512 void GemvAvx512(const T* w, const float* x, float* y, int n, int k) {
  constexpr int kU = Loader::kUnroll;
  const int kb = k / (16 * kU) * (16 * kU), k16 = k / 16 * 16;
  const __mmask16 tail = TailMask(k - k16);
  __m512 sums[16];  // the rows' vectors whose lanes sum to y, 16 rows at a time
  for (int r = 0; r < n; ++r) {
    const T* row = w + int64_t{r} * k;
    __m512 a[kU];
    for (int u = 0; u < kU; ++u) a[u] = _mm512_setzero_ps();
    int i = 0;
    for (; i < kb; i += 16 * kU) {
      for (int u = 0; u < kU; ++u) {
        a[u] =
            _mm512_fmadd_ps(Loader::Load(row + i + 16 * u), _mm512_loadu_ps(x + i + 16 * u), a[u]);
      }
    }
    for (; i < k16; i += 16)
      a[0] = _mm512_fmadd_ps(Loader::Load(row + i), _mm512_loadu_ps(x + i), a[0]);
    if (tail) {
      a[1] = _mm512_fmadd_ps(Loader::Load(row + i, tail), _mm512_maskz_loadu_ps(tail, x + i), a[1]);
    }
    for (int u = 2; u < kU; ++u) a[u & 1] = _mm512_add_ps(a[u & 1], a[u]);
    sums[r % 16] = _mm512_add_ps(a[0], a[1]);
    if (r % 16 == 15) _mm512_storeu_ps(y + r - 15, SumLanes16(sums));
  }
  for (int r = n / 16 * 16; r < n; ++r) y[r] = SumLanes(sums[r % 16]);
}

// 16 quantized values narrowed to T and stored.
PDSERVE_AVX512 inline void StoreNarrowed(int8_t* q, __m512i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(v));
}
PDSERVE_AVX512 inline void StoreNarrowed(int16_t* q, __m512i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_cvtepi32_epi16(v));
}

// QuantizeGroupsPortable, 32 values at a time: the same operations (a
// division, round to nearest even, clamp), so the same bits.
template <typename T>
PDSERVE_AVX512 void QuantizeGroupsAvx512(const float* w, int64_t n, int64_t k, float limit, T* q,
                                         float* scales) {
  const int64_t groups = Int8Groups(k), full = k / kInt8Group;
  const __m512 lo = _mm512_set1_ps(-limit), hi = _mm512_set1_ps(limit);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < full; ++g) {
      const int64_t at = r * k + g * kInt8Group;
      const __m512 a = _mm512_loadu_ps(w + at), b = _mm512_loadu_ps(w + at + 16);
      const float max_abs = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      const float scale = max_abs / limit;
      scales[r * groups + g] = scale;
      __m512i qa = _mm512_setzero_si512(), qb = qa;
      if (scale > 0) {
        const __m512 sv = _mm512_set1_ps(scale);
        constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        qa = _mm512_cvtps_epi32(_mm512_min_ps(
            _mm512_max_ps(_mm512_roundscale_ps(_mm512_div_ps(a, sv), kNearest), lo), hi));
        qb = _mm512_cvtps_epi32(_mm512_min_ps(
            _mm512_max_ps(_mm512_roundscale_ps(_mm512_div_ps(b, sv), kNearest), lo), hi));
      }
      StoreNarrowed(q + at, qa);
      StoreNarrowed(q + at + 16, qb);
    }
    if (full < groups) {
      const int64_t at = r * k + full * kInt8Group;
      QuantizeGroupsPortable(w + at, 1, k - full * kInt8Group, limit, q + at,
                             scales + r * groups + full);
    }
  }
}

// 8 quantized values (one 32-byte vector of int32) narrowed to T and stored.
PDSERVE_AVX2 inline void StoreNarrowed8(int8_t* q, __m256i v) {
  const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(w16, w16));
}
PDSERVE_AVX2 inline void StoreNarrowed8(int16_t* q, __m256i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q),
                   _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

// QuantizeGroupsPortable with AVX2, 32 values at a time: the same
// operations (a division, round to nearest even, clamp; the values are
// within [-limit, limit], so the saturating packs do not saturate), so the
// same bits.
template <typename T>
PDSERVE_AVX2 void QuantizeGroupsAvx2(const float* w, int64_t n, int64_t k, float limit, T* q,
                                     float* scales) {
  const int64_t groups = Int8Groups(k), full = k / kInt8Group;
  const __m256 lo = _mm256_set1_ps(-limit), hi = _mm256_set1_ps(limit);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < full; ++g) {
      const int64_t at = r * k + g * kInt8Group;
      __m256 v[4];
      for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(w + at + 8 * i);
      const __m256 m = _mm256_max_ps(
          _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
          _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float max_abs = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
      const float scale = max_abs / limit;
      scales[r * groups + g] = scale;
      const __m256 sv = _mm256_set1_ps(scale);
      for (int i = 0; i < 4; ++i) {
        __m256i qi = _mm256_setzero_si256();
        if (scale > 0) {
          constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
          qi = _mm256_cvtps_epi32(_mm256_min_ps(
              _mm256_max_ps(_mm256_round_ps(_mm256_div_ps(v[i], sv), kNearest), lo), hi));
        }
        StoreNarrowed8(q + at + 8 * i, qi);
      }
    }
    if (full < groups) {
      const int64_t at = r * k + full * kInt8Group;
      QuantizeGroupsPortable(w + at, 1, k - full * kInt8Group, limit, q + at,
                             scales + r * groups + full);
    }
  }
}

// GemvInt8Act with AVX-512 VNNI. vpdpbusd multiplies unsigned by signed
// bytes, so the weights are flipped to w + 128 (xor 0x80) and each int32 lane
// starts at x.lane_bias = -128 * (sum of its 4 activations): the lane then
// holds the exact sum of its 4 products. A 64-byte chunk is two groups:
// lanes 0-7 the first, 8-15 the second; each lane's sum is converted to fp32
// and scaled by (weight scale * activation scale) of its group, computed
// once per four groups and spread over the lanes by a permute.

#define PDSERVE_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

// acc + (weight chunk c of `row`, loaded under `mask`) . (chunk c of x) * sw
// (per lane: weight scale * activation scale of its group), as described
// above.
PDSERVE_AVX512_VNNI inline __m512 ActChunk(const int8_t* row, const Int8Activations& x, int c,
                                           __mmask64 mask, __m512 sw, __m512 acc) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i wu = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, row + 64 * c), flip);
  const __m512i sums = _mm512_dpbusd_epi32(_mm512_loadu_si512(x.lane_bias.data() + 16 * c), wu,
                                           _mm512_loadu_si512(x.q.data() + 64 * c));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), sw, acc);
}

// GemvInt8 with AVX-512 VNNI. An activation is q = 256 * hi + lo (hi signed,
// lo unsigned bytes), so a 64-byte chunk of weights w takes two vpdpbusd:
// sum(w * hi) as in the int8 ActChunk above (w flipped to unsigned, each lane starting
// at x.hi_bias), shifted left 8, then + sum(lo * w) with lo as the unsigned
// operand. Each lane's sum of 4 products is exact (|w . q| <= 4 * 127 *
// 32767 per lane), converted to fp32 and scaled by (weight scale *
// activation scale) of its group; lanes 0-7 are the chunk's first group, 8-15
// its second.
PDSERVE_AVX512_VNNI inline __m512 ActChunk(const int8_t* row, const Int16Activations& x, int c,
                                           __mmask64 mask, __m512 sw, __m512 acc) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i w = _mm512_maskz_loadu_epi8(mask, row + 64 * c);
  __m512i sums =
      _mm512_dpbusd_epi32(_mm512_loadu_si512(x.hi_bias.data() + 16 * c), _mm512_xor_si512(w, flip),
                          _mm512_loadu_si512(x.hi.data() + 64 * c));
  sums =
      _mm512_dpbusd_epi32(_mm512_slli_epi32(sums, 8), _mm512_loadu_si512(x.lo.data() + 64 * c), w);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), sw, acc);
}

// y[r] for n rows of int8 weights against x (Int8Activations for
// GemvInt8Act, Int16Activations for GemvInt8), 64 values (two groups) per
// ActChunk.
template <typename Activations>
PDSERVE_AVX512_VNNI void GemvVnni(const int8_t* q, const float* scales, const Activations& x,
                                  float* y, int n, int k) {
  const int64_t groups = Int8Groups(k);
  const int chunks = k / 64;  // full 64-value chunks
  // Lanes 0-7 take scale 0 of four, 8-15 scale 1; or scales 2 and 3.
  const __m512i first2 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i next2 = _mm512_add_epi32(first2, _mm512_set1_epi32(2));
  for (int r = 0; r < n; ++r) {
    const int8_t* row = q + int64_t{r} * k;
    const float* s = scales + r * groups;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int c = 0;
    for (; c + 2 <= chunks; c += 2) {  // groups 2c .. 2c + 3, all whole
      // This loop has so few instructions per byte that the out-of-order
      // window alone keeps too few cache misses in flight: prefetching 4 KiB
      // ahead (into L1) streamed about 25% faster in a scratch
      // microbenchmark on the Zen 4 machine, for int8 and 16-bit activations
      // alike. The fp32 and bf16 loops do not prefetch: there it measured
      // neutral or slower.
      _mm_prefetch(reinterpret_cast<const char*>(row + 64 * c) + kInt8Prefetch, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + 64 * c) + kInt8Prefetch + 64, _MM_HINT_T0);
      // The four groups' (weight scale * activation scale).
      const __m512 s4 = _mm512_castps128_ps512(
          _mm_mul_ps(_mm_loadu_ps(s + 2 * c), _mm_loadu_ps(x.scales.data() + 2 * c)));
      acc0 = ActChunk(row, x, c, ~__mmask64{0}, _mm512_permutexvar_ps(first2, s4), acc0);
      acc1 = ActChunk(row, x, c + 1, ~__mmask64{0}, _mm512_permutexvar_ps(next2, s4), acc1);
    }
    // At most two chunks left, the last possibly short. Masked-off weights
    // read as 0 and meet the zero padding of x's arrays.
    for (; 64 * c < k; ++c) {
      const int left = k - 64 * c;
      const __mmask64 mask = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
      const __mmask16 smask = groups - 2 * c >= 2 ? 0x3 : 0x1;
      const __m512 s2 =
          _mm512_castps128_ps512(_mm_mul_ps(_mm_maskz_loadu_ps(smask, s + 2 * c),
                                            _mm_maskz_loadu_ps(smask, x.scales.data() + 2 * c)));
      acc0 = ActChunk(row, x, c, mask, _mm512_permutexvar_ps(first2, s2), acc0);
    }
    y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }
}

// GemvAvx512's accumulators a[u] for u in `Us` (a subset of 0 .. kU - 1),
// for G vectors at once (x: G rows of k): each weight vector is loaded and
// widened once for all of them, and each a[u] takes exactly the products,
// in the order, that GemvAvx512 gives it (the main loop, then the k16
// remainder into a[0] and the masked tail into a[1]).
template <typename Loader, typename T, int G, int... Us>
PDSERVE_AVX512 inline void AccumulateAvx512(const T* row, const float* x, int k,
                                            __m512 (&a)[G][sizeof...(Us)]) {
  constexpr int kU = Loader::kUnroll;
  constexpr int kUs[] = {Us...};
  constexpr int kN = sizeof...(Us);
  const int kb = k / (16 * kU) * (16 * kU), k16 = k / 16 * 16;
  const __mmask16 tail = TailMask(k - k16);
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int j = 0; j < kN; ++j) a[g][j] = _mm512_setzero_ps();
  }
  int i = 0;
  for (; i < kb; i += 16 * kU) {
#pragma GCC unroll 4
    for (int j = 0; j < kN; ++j) {
      const __m512 wv = Loader::Load(row + i + 16 * kUs[j]);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        a[g][j] =
            _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + int64_t{g} * k + i + 16 * kUs[j]), a[g][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < kN; ++j) {
    if (kUs[j] == 0) {
      for (int r = i; r < k16; r += 16) {
        const __m512 wv = Loader::Load(row + r);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          a[g][j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + int64_t{g} * k + r), a[g][j]);
        }
      }
    } else if (kUs[j] == 1 && tail) {
      const __m512 wv = Loader::Load(row + k16, tail);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        a[g][j] =
            _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(tail, x + int64_t{g} * k + k16), a[g][j]);
      }
    }
  }
}

// GemvAvx512 over G vectors at once (x: G rows of k, y: G rows of ldy), each
// vector's result bit for bit GemvAvx512's. With four accumulators (bf16) and
// more than five vectors, 4 G accumulators would not fit the 32 registers:
// each row is then walked twice, over accumulators 0 and 2 (summed as
// GemvAvx512 sums them), then 1 and 3; every weight is still loaded once,
// and the row's second walk reads it from L1.
template <typename Loader, typename T, int G>
PDSERVE_AVX512 void GemvManyAvx512(const T* w, const float* x, float* y, int ldy, int n, int k) {
  constexpr int kU = Loader::kUnroll;
  static_assert(kU == 2 || kU == 4);
  __m512 sums[G][16];  // as in GemvAvx512, per vector
  for (int r = 0; r < n; ++r) {
    const T* row = w + int64_t{r} * k;
    __m512 b0[G], b1[G];
    if constexpr (kU == 2) {
      __m512 a[G][2];
      AccumulateAvx512<Loader, T, G, 0, 1>(row, x, k, a);
      for (int g = 0; g < G; ++g) {
        b0[g] = a[g][0];
        b1[g] = a[g][1];
      }
    } else if constexpr (G <= 5) {  // 20 accumulators
      __m512 a[G][4];
      AccumulateAvx512<Loader, T, G, 0, 1, 2, 3>(row, x, k, a);
      for (int g = 0; g < G; ++g) {
        b0[g] = _mm512_add_ps(a[g][0], a[g][2]);
        b1[g] = _mm512_add_ps(a[g][1], a[g][3]);
      }
    } else {
      __m512 a[G][2];
      AccumulateAvx512<Loader, T, G, 0, 2>(row, x, k, a);
      for (int g = 0; g < G; ++g) b0[g] = _mm512_add_ps(a[g][0], a[g][1]);
      AccumulateAvx512<Loader, T, G, 1, 3>(row, x, k, a);
      for (int g = 0; g < G; ++g) b1[g] = _mm512_add_ps(a[g][0], a[g][1]);
    }
    for (int g = 0; g < G; ++g) sums[g][r % 16] = _mm512_add_ps(b0[g], b1[g]);
    if (r % 16 == 15) {
      for (int g = 0; g < G; ++g)
        _mm512_storeu_ps(y + int64_t{g} * ldy + r - 15, SumLanes16(sums[g]));
    }
  }
  for (int r = n / 16 * 16; r < n; ++r) {
    for (int g = 0; g < G; ++g) y[int64_t{g} * ldy + r] = SumLanes(sums[g][r % 16]);
  }
}

// GemvAvx2 over G vectors at once, likewise.
template <typename Loader, typename T, int G>
PDSERVE_AVX2 void GemvManyAvx2(const T* w, const float* x, float* y, int ldy, int n, int k) {
  const int k32 = k / 32 * 32, k8 = k / 8 * 8;
  for (int r = 0; r < n; ++r) {
    const T* row = w + int64_t{r} * k;
    __m256 a[G][4];
    for (int g = 0; g < G; ++g) {
      for (int u = 0; u < 4; ++u) a[g][u] = _mm256_setzero_ps();
    }
    int i = 0;
    for (; i < k32; i += 32) {
      for (int u = 0; u < 4; ++u) {
        const __m256 wv = Loader::Load(row + i + 8 * u);
        for (int g = 0; g < G; ++g) {
          a[g][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + int64_t{g} * k + i + 8 * u), a[g][u]);
        }
      }
    }
    for (; i < k8; i += 8) {
      const __m256 wv = Loader::Load(row + i);
      for (int g = 0; g < G; ++g) {
        a[g][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + int64_t{g} * k + i), a[g][0]);
      }
    }
    for (int g = 0; g < G; ++g) {
      y[int64_t{g} * ldy + r] = FinishRowAvx2<Loader>(row, x + int64_t{g} * k, k, a[g]);
    }
  }
}

// GemvAvx2's accumulators a[U0] and a[U1] (U0 < U1, of 0 .. 3) for G
// vectors at once: each weight vector is loaded and widened once for all of
// them, and each accumulator takes exactly the products, in the order, that
// GemvAvx2 gives it (the main loop, then the k8 remainder into a[0]).
template <typename Loader, typename T, int G, int U0, int U1>
PDSERVE_AVX2 inline void AccumulatePairAvx2(const T* row, const float* x, int k,
                                            __m256 (&a)[G][2]) {
  const int k32 = k / 32 * 32, k8 = k / 8 * 8;
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = _mm256_setzero_ps();
  int i = 0;
  for (; i < k32; i += 32) {
    const __m256 w0 = Loader::Load(row + i + 8 * U0);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      a[g][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + int64_t{g} * k + i + 8 * U0), a[g][0]);
    }
    const __m256 w1 = Loader::Load(row + i + 8 * U1);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      a[g][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + int64_t{g} * k + i + 8 * U1), a[g][1]);
    }
  }
  if constexpr (U0 == 0) {
    for (; i < k8; i += 8) {
      const __m256 wv = Loader::Load(row + i);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        a[g][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + int64_t{g} * k + i), a[g][0]);
      }
    }
  }
}

// GemvAvx2 over 3 to 6 vectors at once: 4 G accumulators would not fit the
// 16 registers, so each row is walked twice, over accumulators 0 and 1, then
// 2 and 3 (its second walk reads the row from the first level of cache), and
// the sums are formed as GemvAvx2 forms them, so each vector's result is bit
// for bit GemvAvx2's.
template <typename Loader, typename T, int G>
PDSERVE_AVX2 void GemvManyPairsAvx2(const T* w, const float* x, float* y, int ldy, int n, int k) {
  const int k8 = k / 8 * 8;
  for (int r = 0; r < n; ++r) {
    const T* row = w + int64_t{r} * k;
    __m256 a[G][2];
    __m256 s01[G];
    AccumulatePairAvx2<Loader, T, G, 0, 1>(row, x, k, a);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) s01[g] = _mm256_add_ps(a[g][0], a[g][1]);
    AccumulatePairAvx2<Loader, T, G, 2, 3>(row, x, k, a);
    for (int g = 0; g < G; ++g) {
      const float* xg = x + int64_t{g} * k;
      float sum = HorizontalSum8(_mm256_add_ps(s01[g], _mm256_add_ps(a[g][0], a[g][1])));
      for (int j = k8; j < k; ++j) sum += Loader::Value(row[j]) * xg[j];
      y[int64_t{g} * ldy + r] = sum;
    }
  }
}

// The G-vector kernels for m vectors, up to 8 at a time where their rows of
// x fit in 24 KiB (the first level of cache holds them and the weights
// streaming past; measured slower by half at k = 2560), else up to 4: a
// verification step's 1 + k rows (k = 4 by default) or a batch of 8 in one
// pass over the weights.
template <typename Loader, typename T>
PDSERVE_AVX512 void GemvManyAvx512Groups(const T* w, const float* x, int m, float* y, int ldy,
                                         int n, int k) {
  const int most = std::clamp(static_cast<int>((24 << 10) / (sizeof(float) * k)), 4, 8);
  for (int g0 = 0; g0 < m; g0 += most) {
    const float* xg = x + int64_t{g0} * k;
    float* yg = y + int64_t{g0} * ldy;
    WithCount<8>(std::min(most, m - g0), [&](auto g) {
      if constexpr (g == 1) {
        GemvAvx512<Loader>(w, xg, yg, n, k);
      } else {
        GemvManyAvx512<Loader, T, g>(w, xg, yg, ldy, n, k);
      }
    });
  }
}
// Up to 6 vectors a pass where their rows of x fit in 24 KiB (as above),
// else 2; the vectors split evenly between passes (7 as 4 and 3, not 6 and 1).
template <typename Loader, typename T>
PDSERVE_AVX2 void GemvManyAvx2Groups(const T* w, const float* x, int m, float* y, int ldy, int n,
                                     int k) {
  const int most = std::clamp(static_cast<int>((24 << 10) / (sizeof(float) * k)), 2, 6);
  const int passes = (m + most - 1) / most;
  for (int p = 0, g0 = 0; p < passes; ++p) {
    const int count = (m - g0 + (passes - p) - 1) / (passes - p);
    const float* xg = x + int64_t{g0} * k;
    float* yg = y + int64_t{g0} * ldy;
    WithCount<6>(count, [&](auto g) {
      if constexpr (g == 1) {
        GemvAvx2<Loader>(w, xg, yg, n, k);
      } else if constexpr (g == 2) {
        GemvManyAvx2<Loader, T, 2>(w, xg, yg, ldy, n, k);
      } else {
        GemvManyPairsAvx2<Loader, T, g>(w, xg, yg, ldy, n, k);
      }
    });
    g0 += count;
  }
}

Isa DetectIsa() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kPortable;
}
#else
Isa DetectIsa() { return Isa::kPortable; }
#endif

// `isa`, lowered to what this CPU runs.
Isa Usable(Isa isa) { return std::min(isa, BestIsa()); }

}  // namespace

Isa BestIsa() {
  static const Isa best = DetectIsa();
  return best;
}

bool HasAvx512Vnni() {
#if defined(__x86_64__)
  static const bool vnni = BestIsa() == Isa::kAvx512 && __builtin_cpu_supports("avx512vnni");
  return vnni;
#else
  return false;
#endif
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

// Quantizes with limit 127 (int8) or 32767 (int16).
template <typename T>
void QuantizeGroups(const float* w, int64_t n, int64_t k, float limit, T* q, float* scales) {
#if defined(__x86_64__)
  if (BestIsa() == Isa::kAvx512) return QuantizeGroupsAvx512(w, n, k, limit, q, scales);
  if (BestIsa() == Isa::kAvx2) return QuantizeGroupsAvx2(w, n, k, limit, q, scales);
#endif
  QuantizeGroupsPortable(w, n, k, limit, q, scales);
}

void QuantizeInt8(const float* w, int64_t n, int64_t k, int8_t* q, float* scales) {
  QuantizeGroups(w, n, k, 127.0f, q, scales);
}

// Per 4 values ("lane") of signed bytes v[0, padded): -128 * their sum, the
// VNNI kernels' start for unsigned-times-signed products.
void FillLaneBias(const int8_t* v, size_t padded, AlignedVector<int32_t>& bias) {
  bias.resize(padded / 4);
  for (size_t lane = 0; lane < padded / 4; ++lane) {
    const int8_t* l = v + 4 * lane;
    bias[lane] = -128 * (l[0] + l[1] + l[2] + l[3]);
  }
}

// out.q and out.scales from x[0, k) (QuantizeGroups with `limit`), q padded
// with zeros to a multiple of 64 values; returns that padded length.
template <typename Activations>
size_t QuantizePadded(const float* x, int k, float limit, Activations& out) {
  const size_t padded = (static_cast<size_t>(k) + 63) / 64 * 64;
  out.k = k;
  out.q.assign(padded, 0);
  out.scales.resize(static_cast<size_t>(Int8Groups(k)));
  QuantizeGroups(x, 1, k, limit, out.q.data(), out.scales.data());
  return padded;
}

void QuantizeActivations(const float* x, int k, Int8Activations& out) {
  const size_t padded = QuantizePadded(x, k, 127.0f, out);
  FillLaneBias(out.q.data(), padded, out.lane_bias);
}

void QuantizeActivations16(const float* x, int m, int k, int16_t* q, float* scales) {
  QuantizeGroups(x, m, k, 32767.0f, q, scales);
}

void QuantizeActivations(const float* x, int k, Int16Activations& out) {
  const size_t padded = QuantizePadded(x, k, 32767.0f, out);
  out.hi.resize(padded);
  out.lo.resize(padded);
  for (size_t i = 0; i < padded; ++i) {
    out.hi[i] = static_cast<int8_t>(out.q[i] >> 8);  // arithmetic: q = 256 * hi + lo
    out.lo[i] = static_cast<uint8_t>(out.q[i] & 0xff);
  }
  FillLaneBias(out.hi.data(), padded, out.hi_bias);
}

void DequantizeActivations16(const int16_t* q, const float* scales, int64_t m, int64_t k,
                             float* out) {
  const int64_t groups = Int8Groups(k);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      out[r * k + i] = q[r * k + i] * scales[r * groups + i / kInt8Group];
    }
  }
}

void RoundActivations(const float* x, int m, int k, int bits, float* out) {
  const size_t n = static_cast<size_t>(m) * k;
  std::vector<float> scales(static_cast<size_t>(m * Int8Groups(k)));
  if (bits == 8) {
    std::vector<int8_t> q(n);
    QuantizeInt8(x, m, k, q.data(), scales.data());
    DequantizeInt8(q.data(), scales.data(), m, k, out);
  } else {
    std::vector<int16_t> q(n);
    QuantizeActivations16(x, m, k, q.data(), scales.data());
    DequantizeActivations16(q.data(), scales.data(), m, k, out);
  }
}

void DequantizeInt8(const int8_t* q, const float* scales, int64_t n, int64_t k, float* out) {
  const int64_t groups = Int8Groups(k);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = scales[r * groups + g];
      const int64_t begin = r * k + g * kInt8Group, end = r * k + std::min(k, (g + 1) * kInt8Group);
      for (int64_t i = begin; i < end; ++i) out[i] = q[i] * scale;
    }
  }
}

void GemvF32(const float* w, const float* x, float* y, int n, int k, Isa isa) {
  switch (Usable(isa)) {
#if defined(__x86_64__)
    case Isa::kAvx512:
      return GemvAvx512<F32x16>(w, x, y, n, k);
    case Isa::kAvx2:
      return GemvAvx2<F32x8>(w, x, y, n, k);
#else
    case Isa::kAvx512:
    case Isa::kAvx2:
#endif
    case Isa::kPortable:
      return GemvF32Portable(w, x, y, n, k);
  }
}

void GemvBf16(const uint16_t* w, const float* x, float* y, int n, int k, Isa isa) {
  switch (Usable(isa)) {
#if defined(__x86_64__)
    case Isa::kAvx512:
      return GemvAvx512<Bf16x16>(w, x, y, n, k);
    case Isa::kAvx2:
      return GemvAvx2<Bf16x8>(w, x, y, n, k);
#else
    case Isa::kAvx512:
    case Isa::kAvx2:
#endif
    case Isa::kPortable:
      return GemvBf16Portable(w, x, y, n, k);
  }
}

void GemvManyF32(const float* w, const float* x, int m, float* y, int ldy, int n, int k, Isa isa) {
  switch (Usable(isa)) {
#if defined(__x86_64__)
    case Isa::kAvx512:
      return GemvManyAvx512Groups<F32x16>(w, x, m, y, ldy, n, k);
    case Isa::kAvx2:
      return GemvManyAvx2Groups<F32x8>(w, x, m, y, ldy, n, k);
#else
    case Isa::kAvx512:
    case Isa::kAvx2:
#endif
    case Isa::kPortable:
      for (int v = 0; v < m; ++v) {
        GemvF32Portable(w, x + int64_t{v} * k, y + int64_t{v} * ldy, n, k);
      }
  }
}

void GemvManyBf16(const uint16_t* w, const float* x, int m, float* y, int ldy, int n, int k,
                  Isa isa) {
  switch (Usable(isa)) {
#if defined(__x86_64__)
    case Isa::kAvx512:
      return GemvManyAvx512Groups<Bf16x16>(w, x, m, y, ldy, n, k);
    case Isa::kAvx2:
      return GemvManyAvx2Groups<Bf16x8>(w, x, m, y, ldy, n, k);
#else
    case Isa::kAvx512:
    case Isa::kAvx2:
#endif
    case Isa::kPortable:
      for (int v = 0; v < m; ++v) {
        GemvBf16Portable(w, x + int64_t{v} * k, y + int64_t{v} * ldy, n, k);
      }
  }
}

void GemvInt8(const int8_t* q, const float* scales, const Int16Activations& x, float* y, int n,
              int k, Isa isa) {
  switch (Usable(isa)) {
#if defined(__x86_64__)
    case Isa::kAvx512:
      if (HasAvx512Vnni()) return GemvVnni(q, scales, x, y, n, k);
      return GemvInt8Avx2(q, scales, x, y, n, k);  // AVX-512 without VNNI
    case Isa::kAvx2:
      return GemvInt8Avx2(q, scales, x, y, n, k);
#else
    case Isa::kAvx512:
    case Isa::kAvx2:
#endif
    case Isa::kPortable:
      return GemvInt8Portable(q, scales, x, y, n, k);
  }
}

void GemvInt8Act(const int8_t* q, const float* scales, const Int8Activations& x, float* y, int n,
                 int k, Isa isa) {
#if defined(__x86_64__)
  if (Usable(isa) == Isa::kAvx512 && HasAvx512Vnni()) {
    return GemvVnni(q, scales, x, y, n, k);
  }
#endif
  GemvInt8ActPortable(q, scales, x, y, n, k);
}

}  // namespace pdserve::engine::cpu
