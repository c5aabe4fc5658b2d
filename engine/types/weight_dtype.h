// How a backend stores weight matrices in memory, chosen per process
// (RunnerOptions::weight_dtype, the workers' --weight_dtype flag). Norms,
// biases and activations are fp32 whatever is chosen, except that the int8
// dtypes round the activations entering each matrix product of the CPU
// backend: kInt8 to 16-bit integers (258 times finer than the weights'
// rounding), kW8A8 and kInt4 to 8-bit.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::engine {

enum class WeightDtype {
  // bf16 for a matrix whose values are all exactly bf16 numbers (a bf16
  // checkpoint's), else fp32: the checkpoint's numbers, no rounding.
  kAuto,
  kF32,   // every matrix in fp32
  kBf16,  // every matrix in bf16, values rounded to nearest even
  // int8 weights: each row in groups of 32 values, one fp32 scale per
  // group (max |value| / 127), values rounded to nearest (Q8_0-like). The
  // CPU backend multiplies them by the activations rounded to 16 bits per
  // group of 32 (max |x| / 32767) in exact integer dot products; the error
  // is the weights' (docs/decisions/cpu-weights.md).
  kInt8,
  // kInt8 weights, and each activation row entering a matrix product
  // quantized the same way (groups of 32, scale max |x| / 127) before it:
  // int8 x int8 dot products (Q8_0 x Q8_0), a second rounding on top of
  // kInt8's. Opt-in; see docs/decisions/cpu-weights.md.
  kW8A8,
  // 4-bit weights: each row in groups of 32 values, one fp16 scale per
  // group (the value of largest magnitude / -8), values rounded to nearest
  // and clamped to [-8, 7] (llama.cpp's Q4_0). The CPU backend multiplies
  // them by the activations quantized to int8 per group of 32 (as kW8A8) in
  // exact integer dot products (Q4_0 x Q8_0). The CUDA backend refuses it.
  kInt4,
};

// "auto", "f32", "bf16", "int8", "w8a8", "int4".
std::string_view WeightDtypeName(WeightDtype dtype);
// The inverse of WeightDtypeName; INVALID_ARGUMENT names the accepted values.
absl::StatusOr<WeightDtype> ParseWeightDtype(std::string_view name);

// Abseil flag support: ABSL_FLAG(engine::WeightDtype, weight_dtype, ...).
bool AbslParseFlag(absl::string_view text, WeightDtype* dtype, std::string* error);
std::string AbslUnparseFlag(WeightDtype dtype);

}  // namespace pdserve::engine
