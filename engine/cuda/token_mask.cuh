// Structured output on the device: the token mask a request's constraint
// gives (engine/types/token_constraint.h: bit id % 32 of word id / 32)
// applied to its logits row, as engine::ApplyLogitsProcessors does on the
// CPU: masked ids become -inf, so the sampler never draws them. The host
// computes the masks from the requests' histories while the step's forward
// pass runs on the device; one upload of vocab / 8 bytes per masked row.
#pragma once

#include <cstdint>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

// logits [rows, vocab]; row r is masked with masks + mask_rows[r] * words
// (words = (vocab + 31) / 32), or left alone where mask_rows[r] < 0.
cudaError_t ApplyTokenMasks(float* logits, int rows, int vocab, const int32_t* mask_rows,
                            const uint32_t* masks, cudaStream_t stream);

}  // namespace pdserve::cuda
