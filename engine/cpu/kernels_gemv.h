// Weight-streaming GEMV kernels: y[r] = dot(w row r, x) for n rows of k
// values stored in fp32, bf16 or int8 (with per-group scales), accumulated
// in fp32 (int8: in exact integer sums per group, then fp32). Batch-1 decode is these kernels
// reading every weight once, so their speed is the rate at which one core streams memory.
//
// Each kernel sums a row on its own, one row after another, never several
// rows interleaved within one stretch of memory: on the Zen 4 machines this
// project is measured on, interleaving several neighbouring rows streamed
// about half as fast (docs/performance.md). The AVX2 fp32 and bf16 kernels
// walk four rows at once, one from each quarter of their rows (r, r + n / 4,
// ...), the int8 one two (each also streams its scales): ascending address
// streams far apart, which read fp32 weights at 20 GB/s where one stream
// read 11 and two 16 on a Zen 3 EPYC guest; each row is still summed
// exactly as alone. The instruction set is chosen at run
// time (BestIsa); the portable code is the reference the others are tested
// against. These functions are single-threaded; callers split rows across
// threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace pdserve::engine::cpu {

// Instruction sets the kernels are built for, in increasing order.
enum class Isa { kPortable, kAvx2, kAvx512 };

// The widest Isa this CPU runs (kAvx2 needs AVX2 + FMA; kAvx512 needs
// AVX-512 F and BW).
Isa BestIsa();
// Whether the CPU has AVX-512 VNNI (int8 dot products into int32), which
// GemvInt8 and GemvInt8Act use at Isa::kAvx512.
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

// An allocator of 64-byte aligned storage: the activation arrays below are
// read a 64-byte vector at a time, and loads that straddle two cache lines
// streamed the weights about 20% slower in a scratch microbenchmark on the
// Zen 4 machine (docs/performance.md).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

// An activation vector quantized for GemvInt8Act: x[0, k) as QuantizeInt8
// quantizes one row (groups of 32, scale max |x| / 127, round to nearest),
// plus what the AVX-512 VNNI kernel reads per 4 values ("lane"). Arrays are
// padded with zeros to a multiple of 64 values. Reused across calls.
struct Int8Activations {
  int k = 0;
  AlignedVector<int8_t> q;           // [padded k]
  AlignedVector<float> scales;       // [Int8Groups(k)]
  AlignedVector<int32_t> lane_bias;  // [padded k / 4]: -128 * (sum of the lane's 4 q)
};
// Fills `out` from x[0, k), k >= 1.
void QuantizeActivations(const float* x, int k, Int8Activations& out);

// `isa` above BestIsa() runs BestIsa().
void GemvF32(const float* w, const float* x, float* y, int n, int k, Isa isa);
// bf16: the upper 16 bits of the fp32 value.
void GemvBf16(const uint16_t* w, const float* x, float* y, int n, int k, Isa isa);
// GemvF32 / GemvBf16 for m vectors at once (x: m rows of k; y[v * ldy + r]
// for vector v): each weight is read once for all of them, and each vector's
// result is bit for bit what GemvF32 / GemvBf16 gives for it alone, so a
// sequence's numbers do not depend on what shares its step. For the few
// rows of a verification step or a small decode batch.
void GemvManyF32(const float* w, const float* x, int m, float* y, int ldy, int n, int k, Isa isa);
void GemvManyBf16(const uint16_t* w, const float* x, int m, float* y, int ldy, int n, int k,
                  Isa isa);
// The activations of an int8 matrix (WeightDtype::kInt8): x rounded to
// 16-bit integers in groups of 32 (scale max |x| / 32767, round to nearest),
// a rounding 258 times finer than the weights' (max / 127), so the error
// stays the weights'; the dot products are then exact integer sums. Besides
// q, what the AVX-512 VNNI kernel reads: q = 256 * hi + lo (hi signed, lo
// unsigned) and per 4 values ("lane") -128 * (sum of their hi). Arrays
// are padded with zeros to a multiple of 64 values. Reused across calls.
struct Int16Activations {
  int k = 0;
  AlignedVector<int16_t> q;        // [padded k]
  AlignedVector<float> scales;     // [Int8Groups(k)]
  AlignedVector<int8_t> hi;        // [padded k]: q >> 8
  AlignedVector<uint8_t> lo;       // [padded k]: q & 0xff
  AlignedVector<int32_t> hi_bias;  // [padded k / 4]
};
// m rows of k values rounded as above into q (m * k) and scales
// (m * Int8Groups(k)).
void QuantizeActivations16(const float* x, int m, int k, int16_t* q, float* scales);
// out[r, i] = q[r, i] * the scale of its group.
void DequantizeActivations16(const int16_t* q, const float* scales, int64_t m, int64_t k,
                             float* out);
// Fills `out` from x[0, k), k >= 1.
void QuantizeActivations(const float* x, int k, Int16Activations& out);
// m rows of k values rounded as the int8 GEMVs round their activations
// (bits 16: QuantizeActivations16; bits 8: QuantizeInt8), back in fp32:
// what the GEMM of more than one row multiplies.
void RoundActivations(const float* x, int m, int k, int bits, float* out);

// int8 weights times 16-bit activations: y[r] = sum over groups g of
// scale[r, g] * (x.scales[g] * (sum_{i in g} q[r, i] * x.q[i])), the integer
// sums exact, the rest in fp32. Isa::kAvx512 uses AVX-512 VNNI where
// HasAvx512Vnni(), else AVX2 (vpmaddwd).
void GemvInt8(const int8_t* q, const float* scales, const Int16Activations& x, float* y, int n,
              int k, Isa isa);
// int8 weights times int8 activations (WeightDtype::kW8A8): y[r] = sum over
// groups g of scale[r, g] * x.scales[g] * (sum_{i in g} q[r, i] * x.q[i]),
// the integer sums exact (int32), the rest in fp32. Isa::kAvx512 uses AVX-512
// VNNI where HasAvx512Vnni(), else (and below kAvx512) portable code.
void GemvInt8Act(const int8_t* q, const float* scales, const Int8Activations& x, float* y, int n,
                 int k, Isa isa);

}  // namespace pdserve::engine::cpu
