// The int8 GEMM of prefill; see kernels_gemm_int8.h for the contract.
#include "engine/cpu/kernels_gemm_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cpu/count_dispatch.h"
#include "engine/cpu/x86_intrinsics.h"

namespace pdserve::engine::cpu {
namespace {

// ---- portable reference ----

void GemmInt8Portable(const int8_t* q, const float* scales, int n, const Int8ActivationRows& x,
                      float* y, int64_t ldy) {
  const int k = x.k;
  const int64_t groups = Int8Groups(k);
  for (int t = 0; t < x.m; ++t) {
    const int8_t* xq = x.q.data() + int64_t{t} * x.stride;
    const float* xs = x.scales.data() + t * groups;
    for (int r = 0; r < n; ++r) {
      const int8_t* row = q + int64_t{r} * k;
      const float* ws = scales + r * groups;
      float sum = 0;
      for (int64_t g = 0; g < groups; ++g) {
        const int begin = static_cast<int>(g * kInt8Group), end = std::min(k, begin + kInt8Group);
        int32_t dot = 0;  // at most 32 * 127 * 127 in magnitude
        for (int i = begin; i < end; ++i) dot += row[i] * xq[i];
        sum = std::fma(static_cast<float>(dot), ws[g] * xs[g], sum);
      }
      y[int64_t{t} * ldy + r] = sum;
    }
  }
}

#if defined(__x86_64__)

// ---- packed panels of 16 rows ----
//
// A panel holds 16 rows (zeros past the last row) in Int8Groups(k) groups;
// group g is 640 bytes:
//   [0, 512)    8 blocks of 64 bytes, block j: rows 0..15, each its 4 values
//               g * 32 + 4j .. + 3 (zeros past k);
//   [512, 576)  the 16 rows' scales of group g (fp32);
//   [576, 640)  the 16 rows' -128 * (sum of their values in group g) (int32):
//               the start of the VNNI sums, whose activations carry +128.
constexpr int kPanelRows = 16;
constexpr int kGroupBytes = 640;
// Rows repacked at a time: 4 panels, at most 240 KiB for k = 3072.
constexpr int kChunkRows = 64;

// Rows [0, count) of q / scales (count <= kChunkRows) into panels at `out`.
// A whole group of a row is 8 words of 4 values, each copied to its block
// as one 4-byte store.
void PackPanels(const int8_t* q, const float* scales, int count, int k, uint8_t* out) {
  const int64_t groups = Int8Groups(k);
  const int64_t full = k / kInt8Group;
  const int panels = (count + kPanelRows - 1) / kPanelRows;
  if (count % kPanelRows != 0 || full < groups) {
    std::memset(out, 0, static_cast<size_t>(panels * groups * kGroupBytes));
  }
  for (int r = 0; r < count; ++r) {
    uint8_t* panel = out + (r / kPanelRows) * groups * kGroupBytes;
    const int lane = r % kPanelRows;
    const int8_t* row = q + int64_t{r} * k;
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* group = panel + g * kGroupBytes;
      const int8_t* values = row + g * kInt8Group;
      int32_t sum = 0;
      if (g < full) {
        for (int j = 0; j < kInt8Group / 4; ++j) {
          std::memcpy(group + 64 * j + 4 * lane, values + 4 * j, 4);
        }
        for (int i = 0; i < kInt8Group; ++i) sum += values[i];
      } else {
        for (int i = 0; i < k - g * kInt8Group; ++i) {
          group[64 * (i / 4) + 4 * lane + i % 4] = static_cast<uint8_t>(values[i]);
          sum += values[i];
        }
      }
      std::memcpy(group + 512 + 4 * lane, scales + r * groups + g, sizeof(float));
      const int32_t bias = -128 * sum;
      std::memcpy(group + 576 + 4 * lane, &bias, sizeof bias);
    }
  }
}

#define PDSERVE_AVX2 __attribute__((target("avx2,fma")))
#define PDSERVE_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

inline int32_t Word(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline int32_t Word(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ---- AVX-512 VNNI: R panels x T activation rows per pass ----

// y rows t0 .. t0 + T - 1, columns of R panels starting at `panel` (rows
// `valid` of them are real, counted from the first panel's row 0).
template <int R, int T>
PDSERVE_AVX512_VNNI void VnniTile(const uint8_t* panel, int64_t panel_bytes, int64_t groups,
                                  const Int8ActivationRows& x, int t0, float* y, int64_t ldy,
                                  int valid) {
  const uint8_t* xu[T];
  const float* xs[T];
  for (int t = 0; t < T; ++t) {
    xu[t] = x.biased.data() + int64_t{t0 + t} * x.stride;
    xs[t] = x.scales.data() + (t0 + t) * groups;
  }
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* gp[R];
    __m512i sums[R][T];
    for (int r = 0; r < R; ++r) {
      gp[r] = panel + r * panel_bytes + g * kGroupBytes;
      const __m512i bias = _mm512_loadu_si512(gp[r] + 576);
      for (int t = 0; t < T; ++t) sums[r][t] = bias;
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i w[R];
      for (int r = 0; r < R; ++r) w[r] = _mm512_loadu_si512(gp[r] + 64 * j);
      for (int t = 0; t < T; ++t) {
        const __m512i xb = _mm512_set1_epi32(Word(xu[t] + g * kInt8Group + 4 * j));
        for (int r = 0; r < R; ++r) sums[r][t] = _mm512_dpbusd_epi32(sums[r][t], xb, w[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 ws = _mm512_loadu_ps(reinterpret_cast<const float*>(gp[r] + 512));
      for (int t = 0; t < T; ++t) {
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][t]),
                                    _mm512_mul_ps(ws, _mm512_set1_ps(xs[t][g])), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const int left = valid - r * kPanelRows;
    if (left <= 0) break;
    const __mmask16 mask =
        left >= kPanelRows ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
    for (int t = 0; t < T; ++t) {
      _mm512_mask_storeu_ps(y + int64_t{t0 + t} * ldy + r * kPanelRows, mask, acc[r][t]);
    }
  }
}

// ---- AVX2: one panel (two 8-row halves) x T activation rows per pass ----

template <int T>
PDSERVE_AVX2 void Avx2Tile(const uint8_t* panel, int64_t groups, const Int8ActivationRows& x,
                           int t0, float* y, int64_t ldy, int valid) {
  const int8_t* xq[T];
  const float* xs[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    xq[t] = x.q.data() + int64_t{t0 + t} * x.stride;
    xs[t] = x.scales.data() + (t0 + t) * groups;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[2][T];
#pragma GCC unroll 8
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[h][t] = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* gp = panel + g * kGroupBytes;
    __m256i sums[2][T];
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) sums[h][t] = _mm256_setzero_si256();
    }
    // (Unrolled fully, GCC 12 kept all 16 products of a pass in memory and
    // summed them after.)
#pragma GCC unroll 2
    for (int j = 0; j < 8; ++j) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp + 64 * j));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp + 64 * j + 32));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        // |x| times the weights with x's sign: each pair of products fits
        // in int16 (2 * 127 * 127), so vpmaddubsw does not saturate.
        const __m256i xb = _mm256_set1_epi32(Word(xq[t] + g * kInt8Group + 4 * j));
        const __m256i ax = _mm256_abs_epi8(xb);
        sums[0][t] = _mm256_add_epi32(
            sums[0][t],
            _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xb)), ones));
        sums[1][t] = _mm256_add_epi32(
            sums[1][t],
            _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xb)), ones));
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const __m256 ws = _mm256_loadu_ps(reinterpret_cast<const float*>(gp + 512) + 8 * h);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[h][t]),
                                    _mm256_mul_ps(ws, _mm256_set1_ps(xs[t][g])), acc[h][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    alignas(32) float out[kPanelRows];
    _mm256_store_ps(out, acc[0][t]);
    _mm256_store_ps(out + 8, acc[1][t]);
    std::memcpy(y + int64_t{t0 + t} * ldy, out, sizeof(float) * std::min(valid, kPanelRows));
  }
}

// Activation rows per pass.
constexpr int kVnniRows = 4;
constexpr int kAvx2Rows = 2;

void GemmInt8Packed(const int8_t* q, const float* scales, int n, const Int8ActivationRows& x,
                    float* y, int64_t ldy, bool vnni) {
  const int k = x.k;
  const int64_t groups = Int8Groups(k);
  const int64_t panel_bytes = groups * kGroupBytes;
  thread_local AlignedVector<uint8_t> packed;
  packed.resize(static_cast<size_t>(kChunkRows / kPanelRows * panel_bytes));
  for (int c0 = 0; c0 < n; c0 += kChunkRows) {
    const int count = std::min(kChunkRows, n - c0);
    PackPanels(q + int64_t{c0} * k, scales + c0 * groups, count, k, packed.data());
    const int panels = (count + kPanelRows - 1) / kPanelRows;
    if (vnni) {
      for (int p = 0; p < panels; p += 2) {
        const int valid = count - p * kPanelRows;
        const uint8_t* panel = packed.data() + p * panel_bytes;
        float* yp = y + c0 + p * kPanelRows;
        for (int t0 = 0; t0 < x.m; t0 += kVnniRows) {
          WithCount<kVnniRows>(x.m - t0, [&](auto rows) {
            if (panels - p >= 2) {
              VnniTile<2, decltype(rows)::value>(panel, panel_bytes, groups, x, t0, yp, ldy, valid);
            } else {
              VnniTile<1, decltype(rows)::value>(panel, panel_bytes, groups, x, t0, yp, ldy, valid);
            }
          });
        }
      }
    } else {
      for (int p = 0; p < panels; ++p) {
        const int valid = count - p * kPanelRows;
        const uint8_t* panel = packed.data() + p * panel_bytes;
        for (int t0 = 0; t0 < x.m; t0 += kAvx2Rows) {
          WithCount<kAvx2Rows>(x.m - t0, [&](auto rows) {
            Avx2Tile<decltype(rows)::value>(panel, groups, x, t0, y + c0 + p * kPanelRows, ldy,
                                            valid);
          });
        }
      }
    }
  }
}

#endif  // __x86_64__

}  // namespace

void QuantizeActivationRows(const float* x, int m, int k, Int8ActivationRows& out) {
  const int64_t groups = Int8Groups(k);
  out.m = m;
  out.k = k;
  out.stride = static_cast<int>(groups * kInt8Group);
  const size_t n = static_cast<size_t>(m) * out.stride;
  out.q.assign(n, 0);
  out.biased.resize(n);
  out.scales.resize(static_cast<size_t>(m * groups));
  for (int t = 0; t < m; ++t) {
    QuantizeInt8(x + int64_t{t} * k, 1, k, out.q.data() + int64_t{t} * out.stride,
                 out.scales.data() + t * groups);
  }
  for (size_t i = 0; i < n; ++i) out.biased[i] = static_cast<uint8_t>(out.q[i] ^ 0x80);
}

void GemmInt8(const int8_t* q, const float* scales, int n, const Int8ActivationRows& x, float* y,
              int64_t ldy, Isa isa) {
  if (n <= 0 || x.m <= 0) return;
#if defined(__x86_64__)
  isa = std::min(isa, BestIsa());
  if (isa == Isa::kAvx512 && HasAvx512Vnni()) {
    return GemmInt8Packed(q, scales, n, x, y, ldy, /*vnni=*/true);
  }
  if (isa >= Isa::kAvx2) return GemmInt8Packed(q, scales, n, x, y, ldy, /*vnni=*/false);
#endif
  GemmInt8Portable(q, scales, n, x, y, ldy);
}

}  // namespace pdserve::engine::cpu
