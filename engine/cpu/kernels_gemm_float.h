// The fp32 / bf16 GEMM of prefill with AVX-512: y[t, r] = sum_i w[r, i] *
// x[t, i] for m activation rows (fp32) and n weight rows stored in fp32 or
// bf16, accumulated in fp32.
//
// Weights are repacked, 128 rows x 256 columns at a time, into panels of
// 16 rows stored column by column (one 64-byte vector holds one column's 16
// rows, bf16 widened to fp32 on the way), and each pair of panels is
// multiplied by 12 activation rows per pass: each activation value is
// broadcast once for 32 rows, and the 32 x 12 results stay in 24 vector
// registers across the 256 columns (the register tile of BLIS's SKX
// kernel). Repacking reads each weight once per call, against m
// multiply-adds per weight; so bf16 costs about what fp32 does, and neither
// depends on which kernels OpenBLAS picked for this CPU.
//
// Summation: each output sums its 256-column blocks in order, each block's
// products in column order with fused multiply-adds. Single-threaded;
// callers split rows across threads.
#pragma once

#include <cstdint>

namespace pdserve::engine::cpu {

// Whether GemmF32Panels / GemmBf16Panels run here (AVX-512 F; callers use
// sgemm otherwise).
bool HasFloatGemmPanels();

// y[t * ldy + r] for t < m, r < n; x is m rows of k values (ldx apart), w
// n rows of k. Only where HasFloatGemmPanels().
void GemmF32Panels(const float* w, int n, int k, const float* x, int64_t ldx, int m, float* y,
                   int64_t ldy);
// w: bf16, the upper 16 bits of fp32 values.
void GemmBf16Panels(const uint16_t* w, int n, int k, const float* x, int64_t ldx, int m, float* y,
                    int64_t ldy);

}  // namespace pdserve::engine::cpu
