// Whether OpenBLAS's run-time CPU detection picked kernels as wide as the
// CPU runs. Debian 12's OpenBLAS 0.3.21 (a DYNAMIC_ARCH build) takes CPUs
// newer than it knows, such as family 6 model 207 Xeons, for a "Prescott"
// and runs its SSE3 kernels: sgemm at a quarter to a sixth of the
// AVX-512 kernels' rate (docs/performance.md). The environment variable
// OPENBLAS_CORETYPE overrides the detection, and only before the library is
// loaded, so a process cannot fix it for itself; what it can do is say so
// (docs/decisions/cpu-weights.md).
//
// The runner's fp32, bf16 and int8 prefill GEMMs do not use OpenBLAS on
// AVX-512 CPUs (kernels_gemm_float.h, kernels_gemm_int8.h); what still does:
// int4 prefill, int8 products of 2 to kManyGemvRows rows, and fp32 / bf16
// prefill on CPUs without AVX-512.
#pragma once

#include <string>
#include <string_view>

#include "engine/cpu/kernels_gemv.h"

namespace pdserve::engine::cpu {

// The OPENBLAS_CORETYPE value to set when OpenBLAS core `core` (its
// openblas_get_corename(), any case) runs narrower kernels than `isa`:
// "SKYLAKEX" for Isa::kAvx512 unless the core is an AVX-512 one (SkylakeX,
// CooperLake, SapphireRapids); "HASWELL" for Isa::kAvx2 unless the core is
// an AVX2 or AVX-512 one (also Zen, Excavator); "" otherwise.
std::string SuggestedOpenBlasCore(std::string_view core, Isa isa);

// OpenBLAS's core in this process (openblas_get_corename(), trailing spaces
// removed).
std::string OpenBlasCore();

// "" when OpenBLAS's core suits this CPU (SuggestedOpenBlasCore of
// OpenBlasCore and BestIsa is ""), else a warning that names the core, the
// CPU's instruction set, what runs slower and the variable to set.
// CreateModelRunner logs it once per process when it makes a CPU runner.
std::string OpenBlasCoreWarning();

}  // namespace pdserve::engine::cpu
