// The fp32 / bf16 GEMM of prefill; see kernels_gemm_float.h.
#include "engine/cpu/kernels_gemm_float.h"

#include <algorithm>
#include <cstring>

#include "engine/cpu/count_dispatch.h"
#include "engine/cpu/kernels_gemv.h"
#include "engine/cpu/x86_intrinsics.h"

namespace pdserve::engine::cpu {

#if defined(__x86_64__)
namespace {

#define PDSERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

constexpr int kPanelRows = 16;
constexpr int kChunkRows = 128;  // rows repacked at a time (8 panels)
constexpr int kBlockCols = 256;  // columns repacked at a time
constexpr int kTileTokens = 12;  // activation rows per pass

float Widen(float v) { return v; }
float Widen(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rows [0, count) x columns [k0, k0 + kc) of w (rows k apart) into panels at
// `out`: panel p, column i, lane l = out[(p * kc + i) * 16 + l] = w[p * 16 +
// l, k0 + i] (zeros past the last row).
template <typename T>
void Pack(const T* w, int count, int64_t k, int k0, int kc, float* out) {
  const int panels = (count + kPanelRows - 1) / kPanelRows;
  if (count % kPanelRows != 0) {
    float* last = out + static_cast<int64_t>(panels - 1) * kc * kPanelRows;
    std::memset(last, 0, sizeof(float) * kc * kPanelRows);
  }
  for (int r = 0; r < count; ++r) {
    const T* row = w + r * k + k0;
    float* dst = out + static_cast<int64_t>(r / kPanelRows) * kc * kPanelRows + r % kPanelRows;
    for (int i = 0; i < kc; ++i) dst[i * kPanelRows] = Widen(row[i]);
  }
}

// y tile: rows of R panels at `panel` (panel_stride floats apart, `valid`
// real rows counted from the first) x T activation rows from x (ldx apart),
// over kc columns. accumulate: adds to y, else overwrites it.
template <int R, int T>
PDSERVE_AVX512 void Tile(const float* panel, int64_t panel_stride, const float* x, int64_t ldx,
                         int kc, float* y, int64_t ldy, int valid, bool accumulate) {
  __mmask16 mask[R];
  for (int r = 0; r < R; ++r) {
    const int left = std::clamp(valid - r * kPanelRows, 0, kPanelRows);
    mask[r] = static_cast<__mmask16>((1u << left) - 1);
  }
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      acc[r][t] = accumulate ? _mm512_maskz_loadu_ps(mask[r], y + t * ldy + r * kPanelRows)
                             : _mm512_setzero_ps();
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < kc; ++i) {
    __m512 w[R];
    for (int r = 0; r < R; ++r) w[r] = _mm512_loadu_ps(panel + r * panel_stride + i * kPanelRows);
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(x[t * ldx + i]);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xb, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      _mm512_mask_storeu_ps(y + t * ldy + r * kPanelRows, mask[r], acc[r][t]);
    }
  }
}

template <typename T>
void GemmPanels(const T* w, int n, int k, const float* x, int64_t ldx, int m, float* y,
                int64_t ldy) {
  thread_local AlignedVector<float> packed;
  packed.resize(static_cast<size_t>(kChunkRows) * kBlockCols);
  for (int c0 = 0; c0 < n; c0 += kChunkRows) {
    const int count = std::min(kChunkRows, n - c0);
    const int panels = (count + kPanelRows - 1) / kPanelRows;
    for (int k0 = 0; k0 < k; k0 += kBlockCols) {
      const int kc = std::min(kBlockCols, k - k0);
      Pack(w + static_cast<int64_t>(c0) * k, count, k, k0, kc, packed.data());
      const int64_t stride = static_cast<int64_t>(kc) * kPanelRows;
      for (int t0 = 0; t0 < m; t0 += kTileTokens) {
        const float* xt = x + t0 * ldx + k0;
        WithCount<kTileTokens>(m - t0, [&](auto tokens) {
          constexpr int kT = decltype(tokens)::value;
          for (int p = 0; p < panels; p += 2) {
            const float* panel = packed.data() + p * stride;
            float* yt = y + t0 * ldy + c0 + p * kPanelRows;
            const int valid = count - p * kPanelRows;
            if (panels - p >= 2) {
              Tile<2, kT>(panel, stride, xt, ldx, kc, yt, ldy, valid, k0 > 0);
            } else {
              Tile<1, kT>(panel, stride, xt, ldx, kc, yt, ldy, valid, k0 > 0);
            }
          }
        });
      }
    }
  }
}

}  // namespace

bool HasFloatGemmPanels() { return BestIsa() == Isa::kAvx512; }

void GemmF32Panels(const float* w, int n, int k, const float* x, int64_t ldx, int m, float* y,
                   int64_t ldy) {
  GemmPanels(w, n, k, x, ldx, m, y, ldy);
}

void GemmBf16Panels(const uint16_t* w, int n, int k, const float* x, int64_t ldx, int m, float* y,
                    int64_t ldy) {
  GemmPanels(w, n, k, x, ldx, m, y, ldy);
}

#else  // no AVX-512 kernels off x86-64

bool HasFloatGemmPanels() { return false; }
void GemmF32Panels(const float*, int, int, const float*, int64_t, int, float*, int64_t) {}
void GemmBf16Panels(const uint16_t*, int, int, const float*, int64_t, int, float*, int64_t) {}

#endif

}  // namespace pdserve::engine::cpu
