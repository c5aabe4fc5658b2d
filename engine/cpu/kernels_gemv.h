// Weight-streaming GEMV kernels: y[r] = dot(w row r, x) for n rows of k
// values stored in fp32, bf16 or int8 (with per-group scales), accumulated
// in fp32. Batch-1 decode is these kernels reading every weight once, so
// their speed is the rate at which one core streams memory.
//
// Each kernel walks the rows in order, one row at a time, so a thread's
// reads form a single ascending address stream: on the Zen 4 machines this
// project is measured on, that streams about twice as fast as interleaving
// several rows (docs/performance.md). The instruction set is chosen at run
// time (BestIsa); the portable code is the reference the others are tested
// against. These functions are single-threaded; callers split rows across
// threads.
#pragma once

#include <cstdint>
#include <vector>

namespace pdserve::engine::cpu {

// Instruction sets the kernels are built for, in increasing order.
enum class Isa { kPortable, kAvx2, kAvx512 };

// The widest Isa this CPU runs (kAvx2 needs AVX2 + FMA; kAvx512 needs
// AVX-512 F and BW).
Isa BestIsa();
// Whether the CPU has AVX-512 VNNI (int8 dot products into int32), which
// GemvInt8Act uses at Isa::kAvx512.
bool HasAvx512Vnni();
const char* IsaName(Isa isa);

// Values per int8 scale group: row r's values [g * 32, g * 32 + 32) share
// scales[r * Int8Groups(k) + g]; the last group of a row may be shorter.
inline constexpr int kInt8Group = 32;
inline int64_t Int8Groups(int64_t k) { return (k + kInt8Group - 1) / kInt8Group; }

// Quantizes n rows of k values: scale = max |value| / 127 per group (0 for
// an all-zero group), q = value / scale rounded to nearest and clamped to
// [-127, 127]. |value - q * scale| <= scale / 2 up to fp32 rounding.
// `q` holds n * k values, `scales` n * Int8Groups(k).
void QuantizeInt8(const float* w, int64_t n, int64_t k, int8_t* q, float* scales);
// out[r, i] = q[r, i] * scale of its group, for n rows of k.
void DequantizeInt8(const int8_t* q, const float* scales, int64_t n, int64_t k, float* out);

// An activation vector quantized for GemvInt8Act: x[0, k) as QuantizeInt8
// quantizes one row (groups of 32, scale max |x| / 127, round to nearest),
// plus what the AVX-512 VNNI kernel reads per 4 values ("lane"). Arrays are
// padded with zeros to a multiple of 64 values. Reused across calls.
struct Int8Activations {
  int k = 0;
  std::vector<int8_t> q;           // [padded k]
  std::vector<float> scales;       // [Int8Groups(k)]
  std::vector<int32_t> lane_bias;  // [padded k / 4]: -128 * (sum of the lane's 4 q)
  std::vector<float> lane_scale;   // [padded k / 4]: the scale of the lane's group
};
// Fills `out` from x[0, k), k >= 1.
void QuantizeActivations(const float* x, int k, Int8Activations& out);

// `isa` above BestIsa() runs BestIsa().
void GemvF32(const float* w, const float* x, float* y, int n, int k, Isa isa);
// bf16: the upper 16 bits of the fp32 value.
void GemvBf16(const uint16_t* w, const float* x, float* y, int n, int k, Isa isa);
// y[r] = sum over groups g of scale[r, g] * sum_{i in g} q[r, i] * x[i].
void GemvInt8(const int8_t* q, const float* scales, const float* x, float* y, int n, int k,
              Isa isa);
// int8 weights times int8 activations (WeightDtype::kW8A8): y[r] = sum over
// groups g of scale[r, g] * x.scales[g] * (sum_{i in g} q[r, i] * x.q[i]),
// the integer sums exact (int32), the rest in fp32. Isa::kAvx512 uses AVX-512
// VNNI where HasAvx512Vnni(), else (and below kAvx512) portable code.
void GemvInt8Act(const int8_t* q, const float* scales, const Int8Activations& x, float* y, int n,
                 int k, Isa isa);

}  // namespace pdserve::engine::cpu
