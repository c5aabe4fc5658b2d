// fp32 CPU kernels; see kernels.h for the contracts.
#include "engine/cpu/kernels.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cpu/count_dispatch.h"
#include "engine/cpu/kernels_gemv.h"
#include "engine/cpu/lane_sums.h"
#include "engine/cpu/vector_exp.h"
#include "engine/cpu/x86_intrinsics.h"

namespace pdserve::engine::cpu {

int MatMulThreads(int m, int n, int k, int num_threads) {
  constexpr int64_t kMinWork = int64_t{1} << 17;
  const int64_t work = int64_t{m} * n * k;
  return static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(work / kMinWork, (n + 63) / 64), 1,
                                              std::max(1, num_threads)));
}

void InitBlasThreading() { openblas_set_num_threads(1); }

bool IsBf16Exact(const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof bits);
    if ((bits & 0xFFFFu) != 0) return false;
  }
  return true;
}

std::vector<uint16_t> ToBf16(const float* values, int64_t n) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof bits);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

void Bf16ToFloat(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = uint32_t{in[i]} << 16;
    std::memcpy(&out[i], &bits, sizeof bits);
  }
}

void RmsNorm(const float* x, const float* weight, float* y, int rows, int dim, float eps,
             int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows > 1)
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    float* yr = y + static_cast<int64_t>(r) * dim;
    double sum_sq = 0.0;  // double: rows can be long and values large
    for (int i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + eps));
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void RopeCosSin(int position, const float* inv_freq, int half, float* cos_out, float* sin_out) {
  const float pos = static_cast<float>(position);
  for (int i = 0; i < half; ++i) {
    const float angle = pos * inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    sin_out[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

void ApplyRope(float* x, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* xh = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float a = xh[i], b = xh[i + half];
      xh[i] = a * cos[i] - b * sin[i];
      xh[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = -gate[i];
  ExpFloats(out, out, n);  // std::exp's values, 16 at a time
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + out[i]) * up[i];
}

void AddInPlace(float* y, const float* x, int64_t n, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void AddBias(float* y, const float* bias, int rows, int n, int num_threads) {
#pragma omp parallel for num_threads(num_threads) \
    schedule(static) if (int64_t{rows} * n > (1 << 16))
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<int64_t>(r) * n;
#pragma omp simd
    for (int i = 0; i < n; ++i) yr[i] += bias[i];
  }
}

namespace {

float DotPortable(const float* a, const float* b, int n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void AxpyPortable(float a, const float* x, float* y, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float DotAvx512(const float* a, const float* b, int n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = static_cast<__mmask16>((1u << std::min(16, n - i)) - 1);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f"))) void AxpyAvx512(float a, const float* x, float* y, int n) {
  const __m512 av = _mm512_set1_ps(a);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(
        y + i, m,
        _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// AVX2 (no AVX-512): 8 lanes, a masked load for the last 1-7 values.
__attribute__((target("avx2,fma"))) inline __m256i TailMask8(int r) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), lanes);
}

__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  }
  if (i < n) {
    const __m256i m = TailMask8(n - i);
    s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s0);
  }
  return HorizontalSum8(_mm256_add_ps(s0, s1));
}

__attribute__((target("avx2,fma"))) void AxpyAvx2(float a, const float* x, float* y, int n) {
  const __m256 av = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  if (i < n) {
    const __m256i m = TailMask8(n - i);
    _mm256_maskstore_ps(
        y + i, m, _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
  }
}

// The row k (or v) of n values in registers, up to kMaxVectors of 16 lanes
// (head_dim <= 256); lanes past n are zero.
constexpr int kMaxVectors = 16;
struct Row512 {
  __m512 v[kMaxVectors];
  int full, count;  // whole vectors; all vectors (the last may be masked)
  __mmask16 tail;
};
__attribute__((target("avx512f"))) inline void LoadRow(const float* p, int n, Row512& row) {
  row.full = n / 16;
  row.count = (n + 15) / 16;
  row.tail = static_cast<__mmask16>((1u << (n % 16)) - 1);
  for (int i = 0; i < row.full; ++i) row.v[i] = _mm512_loadu_ps(p + 16 * i);
  if (row.count > row.full) row.v[row.full] = _mm512_maskz_loadu_ps(row.tail, p + 16 * row.full);
}

__attribute__((target("avx512f"))) void DotsOfOneKeyAvx512(const float* q, int count,
                                                           const float* k, int n, float scale,
                                                           float* scores, int64_t stride) {
  Row512 key;
  LoadRow(k, n, key);
  for (int j = 0; j < count; ++j) {
    const float* qj = q + int64_t{j} * n;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 1 < key.full; i += 2) {
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16 * i), key.v[i], s0);
      s1 = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16 * i + 16), key.v[i + 1], s1);
    }
    if (i < key.full) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16 * i), key.v[i], s0);
    if (key.count > key.full) {
      s1 =
          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(key.tail, qj + 16 * key.full), key.v[key.full], s1);
    }
    scores[j * stride] = SumLanes(_mm512_add_ps(s0, s1)) * scale;
  }
}

__attribute__((target("avx512f"))) void AxpysOfOneValueAvx512(const float* weights, int64_t stride,
                                                              const float* v, int n, float* out,
                                                              int count) {
  Row512 value;
  LoadRow(v, n, value);
  for (int j = 0; j < count; ++j) {
    const __m512 a = _mm512_set1_ps(weights[j * stride]);
    float* oj = out + int64_t{j} * n;
    for (int i = 0; i < value.full; ++i) {
      _mm512_storeu_ps(oj + 16 * i, _mm512_fmadd_ps(a, value.v[i], _mm512_loadu_ps(oj + 16 * i)));
    }
    if (value.count > value.full) {
      float* o = oj + 16 * value.full;
      _mm512_mask_storeu_ps(
          o, value.tail,
          _mm512_fmadd_ps(a, value.v[value.full], _mm512_maskz_loadu_ps(value.tail, o)));
    }
  }
}
#endif

// DotsOfKeys for heads of n <= 16 NV values: query head j in NV registers,
// each key's products summed as DotsOfOneKeyAvx512 sums them (s0 over even
// vectors, s1 over odd ones and the masked tail), the lane sums of 16 keys
// at a time by SumLanes16.
template <int NV>
__attribute__((target("avx512f"))) void DotsOfKeysAvx512(const float* q, int count, const float* k,
                                                         int64_t k_stride, int tokens, int n,
                                                         float scale, float* scores,
                                                         int64_t stride) {
  const int full = n / 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n % 16)) - 1);
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int j = 0; j < count; ++j) {
    const float* qj = q + int64_t{j} * n;
    __m512 qv[NV];
    for (int i = 0; i < NV; ++i) {
      qv[i] = i < full ? _mm512_loadu_ps(qj + 16 * i) : _mm512_maskz_loadu_ps(tail, qj + 16 * i);
    }
    float* sj = scores + j * stride;
    __m512 sums[16];
    for (int t = 0; t < tokens; ++t) {
      const float* kt = k + t * k_stride;
      __m512 s0 = _mm512_setzero_ps(), s1 = s0;
      int i = 0;
      for (; i + 1 < full; i += 2) {
        s0 = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(kt + 16 * i), s0);
        s1 = _mm512_fmadd_ps(qv[i + 1], _mm512_loadu_ps(kt + 16 * i + 16), s1);
      }
      if (i < full) s0 = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(kt + 16 * i), s0);
      if (NV > full) {
        s1 = _mm512_fmadd_ps(qv[full], _mm512_maskz_loadu_ps(tail, kt + 16 * full), s1);
      }
      sums[t % 16] = _mm512_add_ps(s0, s1);
      if (t % 16 == 15) {
        _mm512_storeu_ps(sj + t - 15, _mm512_mul_ps(SumLanes16(sums), scale_v));
      }
    }
    for (int t = tokens / 16 * 16; t < tokens; ++t) sj[t] = SumLanes(sums[t % 16]) * scale;
  }
}

// AxpysOfValues for heads of n <= 16 NV values, J heads at a time: their
// outputs in J * NV registers across all the values (J chains of FMAs
// hide each other's latency), each lane's FMAs in token order as
// AxpysOfOneValueAvx512 does them.
template <int NV, int J>
__attribute__((target("avx512f"))) void AxpysOfValuesAvx512(const float* weights, int64_t stride,
                                                            const float* v, int64_t v_stride,
                                                            int tokens, int n, float* out) {
  const int full = n / 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n % 16)) - 1);
  __m512 acc[J][NV];
  for (int j = 0; j < J; ++j) {
    for (int i = 0; i < NV; ++i) {
      const float* o = out + int64_t{j} * n + 16 * i;
      acc[j][i] = i < full ? _mm512_loadu_ps(o) : _mm512_maskz_loadu_ps(tail, o);
    }
  }
  for (int t = 0; t < tokens; ++t) {
    const float* vt = v + t * v_stride;
    __m512 value[NV];
    for (int i = 0; i < NV; ++i) {
      value[i] = i < full ? _mm512_loadu_ps(vt + 16 * i) : _mm512_maskz_loadu_ps(tail, vt + 16 * i);
    }
    for (int j = 0; j < J; ++j) {
      const __m512 a = _mm512_set1_ps(weights[j * stride + t]);
      for (int i = 0; i < NV; ++i) acc[j][i] = _mm512_fmadd_ps(a, value[i], acc[j][i]);
    }
  }
  for (int j = 0; j < J; ++j) {
    for (int i = 0; i < NV; ++i) {
      float* o = out + int64_t{j} * n + 16 * i;
      if (i < full) {
        _mm512_storeu_ps(o, acc[j][i]);
      } else {
        _mm512_mask_storeu_ps(o, tail, acc[j][i]);
      }
    }
  }
}

template <int NV>
__attribute__((target("avx512f"))) void AxpysOfValuesAvx512(const float* weights, int64_t stride,
                                                            const float* v, int64_t v_stride,
                                                            int tokens, int n, float* out,
                                                            int count) {
  constexpr int kJ = NV <= 4 ? 4 : 2;  // at most 16 accumulators
  int j = 0;
  for (; j + kJ <= count; j += kJ) {
    AxpysOfValuesAvx512<NV, kJ>(weights + j * stride, stride, v, v_stride, tokens, n,
                                out + int64_t{j} * n);
  }
  for (; j < count; ++j) {
    AxpysOfValuesAvx512<NV, 1>(weights + j * stride, stride, v, v_stride, tokens, n,
                               out + int64_t{j} * n);
  }
}

#if defined(__x86_64__)
// DotsOfKeys for heads of n <= 8 NV values with AVX2: query head j in NV
// registers, each key's products summed as DotAvx2 sums them (s0 over even
// 8-value chunks and the masked tail, s1 over odd ones), the lane sums of 8
// keys at a time by HorizontalSums8.
template <int NV>
__attribute__((target("avx2,fma"))) void DotsOfKeysAvx2(const float* q, int count, const float* k,
                                                        int64_t k_stride, int tokens, int n,
                                                        float scale, float* scores,
                                                        int64_t stride) {
  const bool has_tail = n % 8 != 0;  // chunk NV - 1 is then masked
  const __m256i tail = TailMask8(n % 8);
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (int j = 0; j < count; ++j) {
    const float* qj = q + int64_t{j} * n;
    __m256 qv[NV];
    for (int i = 0; i < NV; ++i) {
      qv[i] = has_tail && i == NV - 1 ? _mm256_maskload_ps(qj + 8 * i, tail)
                                      : _mm256_loadu_ps(qj + 8 * i);
    }
    float* sj = scores + j * stride;
    __m256 sums[8];
    for (int t = 0; t < tokens; ++t) {
      const float* kt = k + t * k_stride;
      __m256 s0 = _mm256_setzero_ps(), s1 = s0;
      for (int i = 0; i < NV; ++i) {
        if (has_tail && i == NV - 1) {
          s0 = _mm256_fmadd_ps(qv[i], _mm256_maskload_ps(kt + 8 * i, tail), s0);
        } else if (i % 2 == 0) {
          s0 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(kt + 8 * i), s0);
        } else {
          s1 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(kt + 8 * i), s1);
        }
      }
      sums[t % 8] = _mm256_add_ps(s0, s1);
      if (t % 8 == 7) _mm256_storeu_ps(sj + t - 7, _mm256_mul_ps(HorizontalSums8(sums), scale_v));
    }
    for (int t = tokens / 8 * 8; t < tokens; ++t) sj[t] = HorizontalSum8(sums[t % 8]) * scale;
  }
}

// AxpysOfValues with AVX2 for the columns [c0, c0 + w) of every head, w <=
// 8 NV: a head's outputs there in NV registers across all the values, each
// lane's FMAs in token order as AxpyAvx2 does them (columns are
// independent, so splitting them changes no value).
template <int NV>
__attribute__((target("avx2,fma"))) void AxpysOfValuesAvx2(const float* weights, int64_t stride,
                                                           const float* v, int64_t v_stride,
                                                           int tokens, int n, float* out, int count,
                                                           int c0, int w) {
  const bool has_tail = w % 8 != 0;
  const __m256i tail = TailMask8(w % 8);
  for (int j = 0; j < count; ++j) {
    float* o = out + int64_t{j} * n + c0;
    const float* wj = weights + j * stride;
    __m256 acc[NV];
    for (int i = 0; i < NV; ++i) {
      acc[i] = has_tail && i == NV - 1 ? _mm256_maskload_ps(o + 8 * i, tail)
                                       : _mm256_loadu_ps(o + 8 * i);
    }
    for (int t = 0; t < tokens; ++t) {
      const float* vt = v + t * v_stride + c0;
      const __m256 a = _mm256_set1_ps(wj[t]);
      for (int i = 0; i < NV; ++i) {
        const __m256 value = has_tail && i == NV - 1 ? _mm256_maskload_ps(vt + 8 * i, tail)
                                                     : _mm256_loadu_ps(vt + 8 * i);
        acc[i] = _mm256_fmadd_ps(a, value, acc[i]);
      }
    }
    for (int i = 0; i < NV; ++i) {
      if (has_tail && i == NV - 1) {
        _mm256_maskstore_ps(o + 8 * i, tail, acc[i]);
      } else {
        _mm256_storeu_ps(o + 8 * i, acc[i]);
      }
    }
  }
}
#endif

// Whether the block kernels run AVX2 (a CPU without AVX-512).
bool AttentionAvx2() {
#if defined(__x86_64__)
  return BestIsa() == Isa::kAvx2;
#else
  return false;
#endif
}

// Whether DotsOfOneKey and AxpysOfOneValue run AVX-512 for rows of n.
bool AttentionAvx512(int n) {
#if defined(__x86_64__)
  return BestIsa() == Isa::kAvx512 && n <= 16 * kMaxVectors;
#else
  return false;
#endif
}

}  // namespace

void DotsOfOneKey(const float* q, int count, const float* k, int n, float scale, float* scores,
                  int64_t stride) {
#if defined(__x86_64__)
  if (AttentionAvx512(n)) return DotsOfOneKeyAvx512(q, count, k, n, scale, scores, stride);
#endif
  for (int j = 0; j < count; ++j) scores[j * stride] = Dot(q + int64_t{j} * n, k, n) * scale;
}

void AxpysOfOneValue(const float* weights, int64_t stride, const float* v, int n, float* out,
                     int count) {
#if defined(__x86_64__)
  if (AttentionAvx512(n)) return AxpysOfOneValueAvx512(weights, stride, v, n, out, count);
#endif
  for (int j = 0; j < count; ++j) Axpy(weights[j * stride], v, out + int64_t{j} * n, n);
}

void DotsOfKeys(const float* q, int count, const float* k, int64_t k_stride, int tokens, int n,
                float scale, float* scores, int64_t stride) {
#if defined(__x86_64__)
  if (AttentionAvx512(n) && n <= 128) {
    return WithCount<8>((n + 15) / 16, [&](auto nv) {
      DotsOfKeysAvx512<nv>(q, count, k, k_stride, tokens, n, scale, scores, stride);
    });
  }
  if (AttentionAvx2() && n <= 64) {
    return WithCount<8>((n + 7) / 8, [&](auto nv) {
      DotsOfKeysAvx2<nv>(q, count, k, k_stride, tokens, n, scale, scores, stride);
    });
  }
#endif
  for (int t = 0; t < tokens; ++t)
    DotsOfOneKey(q, count, k + t * k_stride, n, scale, scores + t, stride);
}

void AxpysOfValues(const float* weights, int64_t stride, const float* v, int64_t v_stride,
                   int tokens, int n, float* out, int count) {
#if defined(__x86_64__)
  if (AttentionAvx512(n) && n <= 128) {
    return WithCount<8>((n + 15) / 16, [&](auto nv) {
      AxpysOfValuesAvx512<nv>(weights, stride, v, v_stride, tokens, n, out, count);
    });
  }
  if (AttentionAvx2()) {
    for (int c0 = 0; c0 < n; c0 += 64) {  // 8 registers of outputs at a time
      const int w = std::min(64, n - c0);
      WithCount<8>((w + 7) / 8, [&](auto nv) {
        AxpysOfValuesAvx2<nv>(weights, stride, v, v_stride, tokens, n, out, count, c0, w);
      });
    }
    return;
  }
#endif
  for (int t = 0; t < tokens; ++t) {
    AxpysOfOneValue(weights + t, stride, v + t * v_stride, n, out, count);
  }
}

// Attention calls Dot and Axpy once per (head, position) without AVX-512:
// AVX2 where the CPU has it, else the portable loops, built for the baseline
// x86-64 target, 4 lanes wide.
float Dot(const float* a, const float* b, int n) {
#if defined(__x86_64__)
  if (BestIsa() == Isa::kAvx512) return DotAvx512(a, b, n);
  if (BestIsa() == Isa::kAvx2) return DotAvx2(a, b, n);
#endif
  return DotPortable(a, b, n);
}

void Axpy(float a, const float* x, float* y, int n) {
#if defined(__x86_64__)
  if (BestIsa() == Isa::kAvx512) return AxpyAvx512(a, x, y, n);
  if (BestIsa() == Isa::kAvx2) return AxpyAvx2(a, x, y, n);
#endif
  AxpyPortable(a, x, y, n);
}

void Softmax(float* x, int n) {
  const float max = *std::max_element(x, x + n);
  for (int i = 0; i < n; ++i) x[i] -= max;
  ExpFloats(x, x, n);  // std::exp's values, 16 at a time
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += x[i];  // in order: the same sum as ever
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace pdserve::engine::cpu
