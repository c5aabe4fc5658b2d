// fp32 CPU kernels; see kernels.h for the contracts.
#include "engine/cpu/kernels.h"

#include <cblas.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pdserve::engine::cpu {

namespace {

// Threads for a matmul of m x n x k: each gets at least ~kMinWork
// multiply-adds, or the fork and join cost more than they save.
int MatMulThreads(int m, int n, int k, int num_threads) {
  constexpr int64_t kMinWork = int64_t{1} << 17;
  const int64_t work = int64_t{m} * n * k;
  return static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(work / kMinWork, (n + 63) / 64), 1,
                                              std::max(1, num_threads)));
}

float Bf16Value(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// y[r] = dot(w row r, x) for n rows of k bf16 values.
void GemvBf16Portable(const uint16_t* w, const float* x, float* y, int n, int k) {
  for (int r = 0; r < n; ++r) {
    const uint16_t* row = w + int64_t{r} * k;
    float sum = 0;
    for (int i = 0; i < k; ++i) sum += Bf16Value(row[i]) * x[i];
    y[r] = sum;
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline __m256 LoadBf16x8(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

__attribute__((target("avx2,fma"))) inline float HorizontalSum(__m256 v) {
  const __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// As GemvBf16Portable: four rows at a time, eight columns per FMA.
__attribute__((target("avx2,fma"))) void GemvBf16Avx2(const uint16_t* w, const float* x, float* y,
                                                      int n, int k) {
  const int k8 = k / 8 * 8;
  int r = 0;
  for (; r + 4 <= n; r += 4) {
    const uint16_t* w0 = w + int64_t{r} * k;
    const uint16_t* w1 = w0 + k;
    const uint16_t* w2 = w1 + k;
    const uint16_t* w3 = w2 + k;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < k8; i += 8) {
      const __m256 xv = _mm256_loadu_ps(x + i);
      a0 = _mm256_fmadd_ps(LoadBf16x8(w0 + i), xv, a0);
      a1 = _mm256_fmadd_ps(LoadBf16x8(w1 + i), xv, a1);
      a2 = _mm256_fmadd_ps(LoadBf16x8(w2 + i), xv, a2);
      a3 = _mm256_fmadd_ps(LoadBf16x8(w3 + i), xv, a3);
    }
    float s0 = HorizontalSum(a0), s1 = HorizontalSum(a1), s2 = HorizontalSum(a2),
          s3 = HorizontalSum(a3);
    for (int i = k8; i < k; ++i) {
      s0 += Bf16Value(w0[i]) * x[i];
      s1 += Bf16Value(w1[i]) * x[i];
      s2 += Bf16Value(w2[i]) * x[i];
      s3 += Bf16Value(w3[i]) * x[i];
    }
    y[r] = s0;
    y[r + 1] = s1;
    y[r + 2] = s2;
    y[r + 3] = s3;
  }
  GemvBf16Portable(w + int64_t{r} * k, x, y + r, n - r, k);
}

bool HasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
bool HasAvx2Fma() { return false; }
void GemvBf16Avx2(const uint16_t* w, const float* x, float* y, int n, int k) {
  GemvBf16Portable(w, x, y, n, k);
}
#endif

}  // namespace

void InitBlasThreading() { openblas_set_num_threads(1); }

void MatMulTransB(const float* x, const float* w, float* y, int m, int n, int k, int num_threads) {
  if (m == 0 || n == 0) return;
  // Column blocks of y (row blocks of w), a multiple of 16 wide, one per thread.
  const int threads = MatMulThreads(m, n, k, num_threads);
  const int block = ((n + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int n0 = 0; n0 < n; n0 += block) {
    const int nb = std::min(block, n - n0);
    const float* wb = w + static_cast<int64_t>(n0) * k;
    if (m == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, nb, k, 1.0f, wb, k, x, 1, 0.0f, y + n0, 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nb, k, 1.0f, x, k, wb, k, 0.0f,
                  y + n0, n);
    }
  }
}

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

void GemvBf16(const uint16_t* w, const float* x, float* y, int n, int k, bool simd) {
  if (simd && HasAvx2Fma()) {
    GemvBf16Avx2(w, x, y, n, k);
  } else {
    GemvBf16Portable(w, x, y, n, k);
  }
}

void MatMulTransBBf16(const float* x, const uint16_t* w, float* y, int m, int n, int k,
                      int num_threads) {
  if (m == 0 || n == 0) return;
  const int threads = MatMulThreads(m, n, k, num_threads);
  const int block = ((n + threads - 1) / threads + 15) / 16 * 16;
  // Rows of w expanded at a time for sgemm: about 256 KiB of fp32, in L2.
  const int chunk = std::max(16, (1 << 16) / std::max(1, k));
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int n0 = 0; n0 < n; n0 += block) {
    const int nb = std::min(block, n - n0);
    const uint16_t* wb = w + static_cast<int64_t>(n0) * k;
    if (m == 1) {
      GemvBf16(wb, x, y + n0, nb, k);
      continue;
    }
    thread_local std::vector<float> expanded;
    expanded.resize(static_cast<size_t>(chunk) * k);
    for (int c0 = 0; c0 < nb; c0 += chunk) {
      const int cb = std::min(chunk, nb - c0);
      Bf16ToFloat(wb + static_cast<int64_t>(c0) * k, expanded.data(), int64_t{cb} * k);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, cb, k, 1.0f, x, k, expanded.data(), k,
                  0.0f, y + n0 + c0, n);
    }
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
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
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

float Dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void Axpy(float a, const float* x, float* y, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

void Softmax(float* x, int n) {
  const float max = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace pdserve::engine::cpu
