// SwiGLU activation: out[r, i] = silu(gate) * up with gate = gu[r, i] and
// up = gu[r, inter + i] (the fused [gate; up] projection's rows of
// 2 * inter), silu(g) = g / (1 + exp(-g)), as cpu::SwiGlu. gu is fp32 or
// bf16; out [rows, inter] bf16 (the down projection's input).
#pragma once

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

cudaError_t SiluMul(const float* gate_up, int rows, int inter, __nv_bfloat16* out,
                    cudaStream_t stream);
cudaError_t SiluMul(const __nv_bfloat16* gate_up, int rows, int inter, __nv_bfloat16* out,
                    cudaStream_t stream);

}  // namespace pdserve::cuda
