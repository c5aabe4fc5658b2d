// exp of many floats at once, for the softmax of attention and SwiGLU.
//
// ExpFloats computes glibc's expf (sysdeps/ieee754/flt-32/e_expf.c since
// glibc 2.27, as its FMA build runs it) 16 values at a time with AVX-512 (8
// with AVX2, the table read by a gather): the
// same double-precision operations, fused where that build fuses them, and the
// same 32-entry table, so on glibc each value is bit for bit std::exp's
// (tested exhaustively over the range it computes; the CPU runner's numbers
// do not change). Values of magnitude 88 or more, NaN and infinities, and
// every value without AVX2, go to std::exp itself. Under another C
// library the vector path is still that algorithm (error below 0.502 ulp),
// one fixed function of its input.
#pragma once

#include <cstdint>

namespace pdserve::engine::cpu {

// out[i] = exp(in[i]) for i < n; out may alias in.
void ExpFloats(const float* in, float* out, int64_t n);

}  // namespace pdserve::engine::cpu
