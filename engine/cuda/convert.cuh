// Weight conversion at load time: out[i] = bf16(in[i]), rounded to nearest
// even (NaN -> canonical NaN), for n contiguous fp32 or fp16 values.
#pragma once

#include <cstdint>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

cudaError_t ConvertF32ToBf16(const float* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream);
cudaError_t ConvertF16ToBf16(const __half* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream);

}  // namespace pdserve::cuda
