// The int8 GEMM of prefill: m activation rows, each quantized to int8 in
// groups of 32 as QuantizeInt8 quantizes weights (llama.cpp's Q8_0 scheme),
// times n int8 weight rows of kernels_gemv.h's format, in exact int32 sums
// per group and fp32 after:
//   y[t, r] = sum over groups g, in order, of
//             float(sum_{i in g} q[r, i] * x.q[t, i]) * (scale[r, g] * x.scale[t, g]),
// each term added with one fused multiply-add. Every instruction set gives
// those bits (the integer sums are exact and each output's fp32 operations
// are the same ones in the same order), so the portable code is the
// reference the others are tested against.
//
// The AVX-512 VNNI kernel repacks 64 weight rows at a time into panels of
// 16 rows x 4 values (the operand layout of vpdpbusd: one 64-byte vector
// holds 4 consecutive values of 16 rows), then multiplies each panel pair
// by 4 activation rows per pass, each activation word broadcast once for
// 32 rows: 32 rows x 4 tokens of int32 sums and fp32 results stay in
// registers, and the scaling costs 3 vector operations per group against 8
// vpdpbusd. The AVX2 kernel reads the same panels (as 8-row halves) and
// multiplies with vpmaddubsw on |x| and the weights carrying x's sign, 16
// rows x 2 tokens per pass (AVX2 has 16 vector registers). Repacking reads
// each weight once per call, against m multiply-adds per weight.
//
// These functions are single-threaded; callers split rows across threads.
#pragma once

#include <cstdint>

#include "engine/cpu/kernels_gemv.h"

namespace pdserve::engine::cpu {

// m activation rows quantized for GemmInt8. Rows are `stride` values apart
// (k rounded up to a multiple of 32, the padding zeros). Reused across calls.
struct Int8ActivationRows {
  int m = 0;
  int k = 0;
  int stride = 0;
  AlignedVector<int8_t> q;        // [m * stride]
  AlignedVector<uint8_t> biased;  // [m * stride]: q + 128, vpdpbusd's unsigned operand
  AlignedVector<float> scales;    // [m * Int8Groups(k)]
};
// Fills `out` from x [m, k] (m, k >= 1), each row as QuantizeInt8 quantizes
// a row.
void QuantizeActivationRows(const float* x, int m, int k, Int8ActivationRows& out);

// y[t * ldy + r] for t < x.m and r < n, as in the file comment: n rows of k
// = x.k int8 values `q` with Int8Groups(k) `scales` each (QuantizeInt8's
// output). `isa` above BestIsa() runs BestIsa(); Isa::kAvx512 without
// AVX-512 VNNI runs the AVX2 kernel.
void GemmInt8(const int8_t* q, const float* scales, int n, const Int8ActivationRows& x, float* y,
              int64_t ldy, Isa isa);

}  // namespace pdserve::engine::cpu
