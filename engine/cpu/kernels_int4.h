// 4-bit weights (WeightDtype::kInt4) and their GEMV: the layout of
// llama.cpp's Q4_0 with the scales in an array of their own, multiplied by
// activations quantized to int8 per group of 32 (as Q8_0) in exact integer
// dot products.
//
// A row of k values is Int8Groups(k) groups of 32. Per group: one fp16
// scale d = (the group's value of largest magnitude) / -8, and q =
// round(value / d) clamped to [-8, 7], stored as the nibble q + 8 in 16
// bytes: byte j holds value j in its low nibble and value j + 16 in its
// high nibble. So value v is dequantized as (nibble - 8) * d; the largest
// value is exact (q = -8) and every other moves by at most |d| / 2 (|d| for
// one of the opposite sign and the largest magnitude, clamped from 8 to 7).
// A short last group is padded with q = 0.
//
// Like kernels_gemv.h: single-threaded, one row at a time in ascending
// address order, the instruction set chosen at run time; the portable code
// is the reference the others are tested against.
#pragma once

#include <cstdint>

#include "engine/cpu/kernels_gemv.h"

namespace pdserve::engine::cpu {

inline constexpr int kInt4GroupBytes = 16;
// Bytes of one row's values (the scales apart).
inline int64_t Int4RowBytes(int64_t k) { return Int8Groups(k) * kInt4GroupBytes; }

// Quantizes n rows of k values as above: `q` holds n * Int4RowBytes(k)
// bytes, `scales` n * Int8Groups(k) fp16 values. A group whose scale
// overflows fp16 (|value| > 8 * 65504) saturates at the largest finite one.
void QuantizeInt4(const float* w, int64_t n, int64_t k, uint8_t* q, uint16_t* scales);
// out[r, i] = (nibble - 8) * scale of its group, for n rows of k.
void DequantizeInt4(const uint8_t* q, const uint16_t* scales, int64_t n, int64_t k, float* out);
// The same n rows in QuantizeInt8's format, exactly: values[r, i] = nibble -
// 8 (n * k of them), value_scales the fp16 scales as fp32 (n *
// Int8Groups(k)). What the int8 GEMM of prefill multiplies.
void Int4ToInt8(const uint8_t* q, const uint16_t* scales, int64_t n, int64_t k, int8_t* values,
                float* value_scales);

// An activation vector for GemvInt4: x[0, k) quantized as QuantizeInt8
// quantizes one row (groups of 32, scale max |x| / 127, round to nearest),
// padded with zeros to a multiple of 128 values, plus what the kernels add
// for the nibbles' offset of 8 and, for the AVX-512 VNNI kernel, the values
// reordered to meet the nibbles. Reused across calls.
struct Int4Activations {
  int k = 0;
  AlignedVector<int8_t> q;            // [padded k]
  AlignedVector<float> scales;        // [padded k / 32]
  AlignedVector<int32_t> group_bias;  // [padded k / 32]: -8 * (sum of the group's q)
  // Per 4 groups (128 values): values [0, 16) of each group (64 bytes), then
  // values [16, 32) of each: 4-byte lane i of either half is group i / 4.
  AlignedVector<int8_t> split;       // [padded k]
  AlignedVector<int32_t> lane_bias;  // [padded k / 8]: -8 * (sum of lane i's 8 values)
};
// Fills `out` from x[0, k), k >= 1.
void QuantizeActivations(const float* x, int k, Int4Activations& out);

// y[r] = sum over groups g of scale[r, g] * x.scales[g] * (sum_{i in g}
// (nibble[r, i] - 8) * x.q[i]), the integer sums exact (int32), the rest in
// fp32. Isa::kAvx512 uses AVX-512 VNNI where HasAvx512Vnni(), else AVX2
// (vpmaddubsw); Isa::kAvx2 needs F16C too (every AVX2 CPU this project has
// met has it), else portable code.
void GemvInt4(const uint8_t* q, const uint16_t* scales, const Int4Activations& x, float* y, int n,
              int k, Isa isa);

}  // namespace pdserve::engine::cpu
