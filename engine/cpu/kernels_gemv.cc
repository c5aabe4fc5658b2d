// Weight-streaming GEMV kernels; see kernels_gemv.h for the contracts.
#include "engine/cpu/kernels_gemv.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized and -Wuninitialized
// on their own placeholder operands (GCC bug 105593); the kernels read
// nothing uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

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

void GemvInt8Portable(const int8_t* q, const float* scales, const float* x, float* y, int n,
                      int k) {
  const int64_t groups = Int8Groups(k);
  for (int r = 0; r < n; ++r) {
    const int8_t* row = q + int64_t{r} * k;
    const float* s = scales + r * groups;
    float sum = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int end = static_cast<int>(std::min<int64_t>(k, (g + 1) * kInt8Group));
      float part = 0;
      for (int i = static_cast<int>(g * kInt8Group); i < end; ++i) part += row[i] * x[i];
      sum += s[g] * part;
    }
    y[r] = sum;
  }
}

#if defined(__x86_64__)
#define PDSERVE_AVX2 __attribute__((target("avx2,fma")))
#define PDSERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

// ---- AVX2 + FMA: 8 lanes ----

PDSERVE_AVX2 inline float HorizontalSum(__m256 v) {
  const __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

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

PDSERVE_AVX2 inline __m256 LoadInt8x8(const int8_t* p) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
}

// fp32 or bf16 rows: one row at a time, 32 columns per iteration.
template <typename Loader, typename T>
PDSERVE_AVX2 void GemvAvx2(const T* w, const float* x, float* y, int n, int k) {
  const int k32 = k / 32 * 32, k8 = k / 8 * 8;
  for (int r = 0; r < n; ++r) {
    const T* row = w + int64_t{r} * k;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i < k32; i += 32) {
      a0 = _mm256_fmadd_ps(Loader::Load(row + i), _mm256_loadu_ps(x + i), a0);
      a1 = _mm256_fmadd_ps(Loader::Load(row + i + 8), _mm256_loadu_ps(x + i + 8), a1);
      a2 = _mm256_fmadd_ps(Loader::Load(row + i + 16), _mm256_loadu_ps(x + i + 16), a2);
      a3 = _mm256_fmadd_ps(Loader::Load(row + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i < k8; i += 8) a0 = _mm256_fmadd_ps(Loader::Load(row + i), _mm256_loadu_ps(x + i), a0);
    float sum = HorizontalSum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < k; ++i) sum += Loader::Value(row[i]) * x[i];
    y[r] = sum;
  }
}

PDSERVE_AVX2 void GemvInt8Avx2(const int8_t* q, const float* scales, const float* x, float* y,
                               int n, int k) {
  const int64_t groups = Int8Groups(k);
  const int full = k / kInt8Group;  // groups without a tail
  for (int r = 0; r < n; ++r) {
    const int8_t* row = q + int64_t{r} * k;
    const float* s = scales + r * groups;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int g = 0;
    for (; g < full; ++g) {
      const int i = g * kInt8Group;
      __m256 t0 = _mm256_mul_ps(LoadInt8x8(row + i), _mm256_loadu_ps(x + i));
      __m256 t1 = _mm256_mul_ps(LoadInt8x8(row + i + 8), _mm256_loadu_ps(x + i + 8));
      t0 = _mm256_fmadd_ps(LoadInt8x8(row + i + 16), _mm256_loadu_ps(x + i + 16), t0);
      t1 = _mm256_fmadd_ps(LoadInt8x8(row + i + 24), _mm256_loadu_ps(x + i + 24), t1);
      const __m256 scale = _mm256_broadcast_ss(s + g);
      if (g % 2 == 0) {
        acc0 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), scale, acc0);
      } else {
        acc1 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), scale, acc1);
      }
    }
    float sum = HorizontalSum(_mm256_add_ps(acc0, acc1));
    if (g < groups) {
      float part = 0;
      for (int i = g * kInt8Group; i < k; ++i) part += row[i] * x[i];
      sum += s[g] * part;
    }
    y[r] = sum;
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
struct Int8x16 {
  PDSERVE_AVX512 static __m512 Widen(__m128i raw) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
  }
  PDSERVE_AVX512 static __m512 Load(const int8_t* p) {
    return Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  PDSERVE_AVX512 static __m512 Load(const int8_t* p, __mmask16 mask) {
    return Widen(_mm_maskz_loadu_epi8(mask, p));
  }
};

// fp32 or bf16 rows: one row at a time, Loader::kUnroll vectors of 16
// columns per iteration, one accumulator each. fp32 streams fastest with two
// (a 128-byte step), bf16 with four (also 128 bytes): in a scratch
// microbenchmark over the decode matrices of docs/performance.md, fp32 with
// four accumulators streamed about 10% slower than with two.
template <typename Loader, typename T>
PDSERVE_AVX512 void GemvAvx512(const T* w, const float* x, float* y, int n, int k) {
  constexpr int kU = Loader::kUnroll;
  const int kb = k / (16 * kU) * (16 * kU), k16 = k / 16 * 16;
  const __mmask16 tail = TailMask(k - k16);
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
    y[r] = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
  }
}

PDSERVE_AVX512 void GemvInt8Avx512(const int8_t* q, const float* scales, const float* x, float* y,
                                   int n, int k) {
  const int64_t groups = Int8Groups(k);
  const int pairs = k / (2 * kInt8Group);  // two full groups per iteration
  for (int r = 0; r < n; ++r) {
    const int8_t* row = q + int64_t{r} * k;
    const float* s = scales + r * groups;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (int p = 0; p < pairs; ++p) {
      const int i = p * 2 * kInt8Group;
      __m512 t0 = _mm512_mul_ps(Int8x16::Load(row + i), _mm512_loadu_ps(x + i));
      __m512 t1 = _mm512_mul_ps(Int8x16::Load(row + i + 32), _mm512_loadu_ps(x + i + 32));
      t0 = _mm512_fmadd_ps(Int8x16::Load(row + i + 16), _mm512_loadu_ps(x + i + 16), t0);
      t1 = _mm512_fmadd_ps(Int8x16::Load(row + i + 48), _mm512_loadu_ps(x + i + 48), t1);
      acc0 = _mm512_fmadd_ps(t0, _mm512_set1_ps(s[2 * p]), acc0);
      acc1 = _mm512_fmadd_ps(t1, _mm512_set1_ps(s[2 * p + 1]), acc1);
    }
    // At most two groups left, the last possibly short: 16 lanes at a time.
    for (int64_t g = 2 * int64_t{pairs}; g < groups; ++g) {
      const int begin = static_cast<int>(g * kInt8Group);
      __m512 t = _mm512_setzero_ps();
      for (int i = begin; i < std::min(k, begin + kInt8Group); i += 16) {
        const __mmask16 m = TailMask(std::min(16, k - i));
        t = _mm512_fmadd_ps(Int8x16::Load(row + i, m), _mm512_maskz_loadu_ps(m, x + i), t);
      }
      acc0 = _mm512_fmadd_ps(t, _mm512_set1_ps(s[g]), acc0);
    }
    y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
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

void QuantizeInt8(const float* w, int64_t n, int64_t k, int8_t* q, float* scales) {
  const int64_t groups = Int8Groups(k);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = r * k + g * kInt8Group, end = r * k + std::min(k, (g + 1) * kInt8Group);
      float max_abs = 0;
      for (int64_t i = begin; i < end; ++i) max_abs = std::max(max_abs, std::abs(w[i]));
      const float scale = max_abs / 127.0f;
      scales[r * groups + g] = scale;
      for (int64_t i = begin; i < end; ++i) {
        const float v = scale > 0 ? std::nearbyint(w[i] / scale) : 0.0f;
        q[i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
      }
    }
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

void GemvInt8(const int8_t* q, const float* scales, const float* x, float* y, int n, int k,
              Isa isa) {
  switch (Usable(isa)) {
#if defined(__x86_64__)
    case Isa::kAvx512:
      return GemvInt8Avx512(q, scales, x, y, n, k);
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

}  // namespace pdserve::engine::cpu
