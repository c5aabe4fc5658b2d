// 4-bit weight kernels; see kernels_int4.h for the layout and contracts.
#include "engine/cpu/kernels_int4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cpu/x86_intrinsics.h"
#include "engine/model/safetensors.h"

namespace pdserve::engine::cpu {
namespace {

constexpr float kLargestHalf = 65504.0f;

size_t Padded128(int k) { return (static_cast<size_t>(k) + 127) / 128 * 128; }

// sum over the group's values of (nibble - 8) * x[i], exact.
int32_t GroupDot(const uint8_t* group, const int8_t* x) {
  int32_t dot = 0;
  for (int j = 0; j < 16; ++j) {
    dot += ((group[j] & 0xf) - 8) * x[j] + ((group[j] >> 4) - 8) * x[j + 16];
  }
  return dot;
}

void GemvInt4Portable(const uint8_t* q, const uint16_t* scales, const Int4Activations& x, float* y,
                      int n, int k) {
  const int64_t groups = Int8Groups(k);
  for (int r = 0; r < n; ++r) {
    const uint8_t* row = q + r * groups * kInt4GroupBytes;
    const uint16_t* s = scales + r * groups;
    float sum = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int32_t dot = GroupDot(row + g * kInt4GroupBytes, x.q.data() + g * kInt8Group);
      sum += HalfToFloat(s[g]) * (x.scales[g] * static_cast<float>(dot));
    }
    y[r] = sum;
  }
}

#if defined(__x86_64__)
#define PDSERVE_AVX2_F16C __attribute__((target("avx2,fma,f16c")))
#define PDSERVE_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// Bytes ahead of the current block the kernels prefetch (as the int8
// kernels of kernels_gemv.cc).
constexpr int kInt4Prefetch = 4096;

// Eight groups (128 bytes of nibbles) per step, two groups per 32-byte
// load: the low nibbles (values 0-15 of both groups) meet x.split's low
// halves and the high nibbles (16-31) its high halves, as unsigned bytes by
// the signed activations in pairs (vpmaddubsw: |2 * 15 * 127| fits int16,
// and so does the sum of the two halves' pairs), summed to 8 int32 lanes
// (4 per group) that start at x.lane_bias: each group's exact sum over its
// 4 lanes. The lanes are converted to fp32 and scaled by (weight scale *
// activation scale) of their group. A row's last 1-7 groups go one at a
// time, each group's 16 bytes split into 32 nibbles against x.q.
PDSERVE_AVX2_F16C void GemvInt4Avx2(const uint8_t* q, const uint16_t* scales,
                                    const Int4Activations& x, float* y, int n, int k) {
  const int groups = static_cast<int>(Int8Groups(k));
  const int whole = groups / 8 * 8;  // groups in steps of 8
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m256i low4x2 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  // Lanes 0-3 take group 2j's scale, lanes 4-7 group 2j + 1's.
  const __m256i pick[4] = {
      _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
      _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
  alignas(32) float sw[8];
  for (int r = 0; r < n; ++r) {
    const uint8_t* row = q + int64_t{r} * groups * kInt4GroupBytes;
    const uint16_t* s = scales + int64_t{r} * groups;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    for (int g0 = 0; g0 < whole; g0 += 8) {
      // 4 KiB ahead, as the VNNI kernel: the weights stream through once.
      _mm_prefetch(reinterpret_cast<const char*>(row + 16 * g0) + kInt4Prefetch, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + 16 * g0) + kInt4Prefetch + 64, _MM_HINT_T0);
      const __m256 ws =
          _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + g0))),
                        _mm256_loadu_ps(x.scales.data() + g0));
      for (int j = 0; j < 4; ++j) {
        const int g = g0 + 2 * j;
        // Groups g and g + 1 sit in one 128-value block of x.split, at pair
        // (g % 4) / 2 of its low and high halves.
        const int64_t block = g / 4, pair = (g % 4) / 2;
        const int64_t at = block * 128 + 32 * pair;
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * g));
        const __m256i lo = _mm256_and_si256(b, low4x2);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4x2);
        const __m256i xlo =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(x.split.data() + at));
        const __m256i xhi =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(x.split.data() + at + 64));
        const __m256i pairs =
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
        const __m256i bias = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(x.lane_bias.data() + block * 16 + 8 * pair));
        const __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), bias);
        const __m256 scale = _mm256_permutevar8x32_ps(ws, pick[j]);
        if (j % 2 == 0) {
          acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc0);
        } else {
          acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc1);
        }
      }
    }
    const int count = groups - whole;
    for (int j = 0; j < count; ++j) sw[j] = HalfToFloat(s[whole + j]) * x.scales[whole + j];
    for (int j = 0; j < count; ++j) {
      const int g = whole + j;
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * g));
      const __m256i u =
          _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low4), _mm_and_si128(b, low4));
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + 32 * g));
      __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), ones);
      dot = _mm256_add_epi32(dot, _mm256_castsi128_si256(_mm_cvtsi32_si128(x.group_bias[g])));
      if (j % 2 == 0) {
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sw[j]), acc0);
      } else {
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sw[j]), acc1);
      }
    }
    y[r] = HorizontalSum8(_mm256_add_ps(acc0, acc1));
  }
}

// Four groups (64 bytes of nibbles) per step: low nibbles (values 0-15 of
// each group) and high nibbles (16-31) meet x.split's two 64-byte halves in
// two vpdpbusd (nibbles as the unsigned operand), each int32 lane starting
// at x.lane_bias; lanes 4g..4g+3 then hold group g's exact sum in four
// parts, converted to fp32 and scaled by (weight scale * activation scale),
// spread over the lanes by a permute. A last block of fewer than four
// groups is loaded under a mask (masked-off nibbles and scales read 0 and
// meet x's zero padding).
PDSERVE_AVX512_VNNI void GemvInt4Vnni(const uint8_t* q, const uint16_t* scales,
                                      const Int4Activations& x, float* y, int n, int k) {
  const int groups = static_cast<int>(Int8Groups(k));
  const int blocks = (groups + 3) / 4, full = groups / 4;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const int8_t* xs = x.split.data();
  const int32_t* bias = x.lane_bias.data();
  const float* xscale = x.scales.data();
  for (int r = 0; r < n; ++r) {
    const uint8_t* row = q + int64_t{r} * groups * kInt4GroupBytes;
    const uint16_t* s = scales + int64_t{r} * groups;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (int b = 0; b < blocks; ++b) {
      __m512i w;
      __m128 ws;
      if (b < full) {
        _mm_prefetch(reinterpret_cast<const char*>(row + 64 * b) + kInt4Prefetch, _MM_HINT_T0);
        w = _mm512_loadu_si512(row + 64 * b);
        ws = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 4 * b)));
      } else {
        const int left = groups - 4 * b;  // 1 to 3
        w = _mm512_maskz_loadu_epi8((__mmask64{1} << (16 * left)) - 1, row + 64 * b);
        ws =
            _mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << left) - 1), s + 4 * b));
      }
      const __m512i lo = _mm512_and_si512(w, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
      __m512i sums = _mm512_dpbusd_epi32(_mm512_loadu_si512(bias + 16 * b), lo,
                                         _mm512_loadu_si512(xs + 128 * b));
      sums = _mm512_dpbusd_epi32(sums, hi, _mm512_loadu_si512(xs + 128 * b + 64));
      const __m512 sw = _mm512_permutexvar_ps(
          spread, _mm512_castps128_ps512(_mm_mul_ps(ws, _mm_loadu_ps(xscale + 4 * b))));
      if (b % 2 == 0) {
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), sw, acc0);
      } else {
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), sw, acc1);
      }
    }
    y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }
}

bool HasF16c() {
  static const bool f16c = __builtin_cpu_supports("f16c");
  return f16c;
}

// Int4ToInt8 of one row's whole groups with AVX2 and F16C: 16 bytes to 32
// values (low nibbles, then high ones) less 8, and 8 scales per
// conversion. Returns the groups done.
PDSERVE_AVX2_F16C int64_t Int4ToInt8RowAvx2(const uint8_t* in, const uint16_t* scales, int64_t k,
                                            int8_t* out, float* out_scales) {
  const int64_t whole = k / kInt8Group;
  const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  for (int64_t g = 0; g < whole; ++g) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + g * kInt4GroupBytes));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, low4), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), low4), eight);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + g * kInt8Group), _mm256_set_m128i(hi, lo));
  }
  int64_t g = 0;
  for (; g + 8 <= whole; g += 8) {
    _mm256_storeu_ps(
        out_scales + g,
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + g))));
  }
  for (; g < whole; ++g) out_scales[g] = HalfToFloat(scales[g]);
  return whole;
}
#endif

}  // namespace

void QuantizeInt4(const float* w, int64_t n, int64_t k, uint8_t* q, uint16_t* scales) {
  const int64_t groups = Int8Groups(k);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = w + r * k + g * kInt8Group;
      const int count = static_cast<int>(std::min<int64_t>(kInt8Group, k - g * kInt8Group));
      float largest = 0;  // the value of largest magnitude, the first of ties
      for (int i = 0; i < count; ++i) {
        if (std::abs(v[i]) > std::abs(largest)) largest = v[i];
      }
      const uint16_t half = FloatToHalf(std::clamp(largest / -8.0f, -kLargestHalf, kLargestHalf));
      scales[r * groups + g] = half;
      const float d = HalfToFloat(half);
      uint8_t* out = q + (r * groups + g) * kInt4GroupBytes;
      int nibble[32];
      for (int i = 0; i < 32; ++i) {
        const float t = i < count && d != 0 ? std::nearbyint(v[i] / d) : 0.0f;
        nibble[i] = static_cast<int>(std::clamp(t, -8.0f, 7.0f)) + 8;
      }
      for (int j = 0; j < 16; ++j) out[j] = static_cast<uint8_t>(nibble[j] | (nibble[j + 16] << 4));
    }
  }
}

void DequantizeInt4(const uint8_t* q, const uint16_t* scales, int64_t n, int64_t k, float* out) {
  const int64_t groups = Int8Groups(k);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float d = HalfToFloat(scales[r * groups + g]);
      const uint8_t* in = q + (r * groups + g) * kInt4GroupBytes;
      float* o = out + r * k + g * kInt8Group;
      const int count = static_cast<int>(std::min<int64_t>(kInt8Group, k - g * kInt8Group));
      for (int i = 0; i < count; ++i) {
        const int nibble = i < 16 ? in[i] & 0xf : in[i - 16] >> 4;
        o[i] = static_cast<float>(nibble - 8) * d;
      }
    }
  }
}

void Int4ToInt8(const uint8_t* q, const uint16_t* scales, int64_t n, int64_t k, int8_t* values,
                float* value_scales) {
  const int64_t groups = Int8Groups(k);
#if defined(__x86_64__)
  const bool avx2 = BestIsa() >= Isa::kAvx2 && HasF16c();
#endif
  for (int64_t r = 0; r < n; ++r) {
    int64_t g = 0;
#if defined(__x86_64__)
    if (avx2) {
      g = Int4ToInt8RowAvx2(q + r * groups * kInt4GroupBytes, scales + r * groups, k,
                            values + r * k, value_scales + r * groups);
    }
#endif
    for (; g < groups; ++g) {
      value_scales[r * groups + g] = HalfToFloat(scales[r * groups + g]);
      const uint8_t* in = q + (r * groups + g) * kInt4GroupBytes;
      int8_t* o = values + r * k + g * kInt8Group;
      const int count = static_cast<int>(std::min<int64_t>(kInt8Group, k - g * kInt8Group));
      for (int i = 0; i < count; ++i) {
        const int nibble = i < 16 ? in[i] & 0xf : in[i - 16] >> 4;
        o[i] = static_cast<int8_t>(nibble - 8);
      }
    }
  }
}

void QuantizeActivations(const float* x, int k, Int4Activations& out) {
  const size_t padded = Padded128(k), groups = padded / kInt8Group;
  out.k = k;
  out.q.assign(padded, 0);
  out.scales.assign(groups, 0.0f);
  QuantizeInt8(x, 1, k, out.q.data(), out.scales.data());
  out.group_bias.resize(groups);
  for (size_t g = 0; g < groups; ++g) {
    int32_t sum = 0;
    for (int i = 0; i < kInt8Group; ++i) sum += out.q[g * kInt8Group + i];
    out.group_bias[g] = -8 * sum;
  }
  out.split.resize(padded);
  for (size_t b = 0; b < padded / 128; ++b) {
    for (int g = 0; g < 4; ++g) {
      const int8_t* src = out.q.data() + b * 128 + g * kInt8Group;
      std::memcpy(out.split.data() + b * 128 + 16 * g, src, 16);
      std::memcpy(out.split.data() + b * 128 + 64 + 16 * g, src + 16, 16);
    }
  }
  out.lane_bias.resize(padded / 8);
  for (size_t b = 0; b < padded / 128; ++b) {
    for (int lane = 0; lane < 16; ++lane) {
      int32_t sum = 0;
      for (int i = 0; i < 4; ++i) {
        sum += out.split[b * 128 + 4 * lane + i] + out.split[b * 128 + 64 + 4 * lane + i];
      }
      out.lane_bias[b * 16 + lane] = -8 * sum;
    }
  }
}

void GemvInt4(const uint8_t* q, const uint16_t* scales, const Int4Activations& x, float* y, int n,
              int k, Isa isa) {
#if defined(__x86_64__)
  const Isa usable = std::min(isa, BestIsa());
  if (usable == Isa::kAvx512 && HasAvx512Vnni()) return GemvInt4Vnni(q, scales, x, y, n, k);
  if (usable >= Isa::kAvx2 && HasF16c()) return GemvInt4Avx2(q, scales, x, y, n, k);
#else
  (void)isa;
#endif
  GemvInt4Portable(q, scales, x, y, n, k);
}

}  // namespace pdserve::engine::cpu
