// bf16 and fp16 storage types of the CUDA math headers (cuda_bf16.h,
// cuda_fp16.h) for the CPU emulation: `__nv_bfloat16`, `__half`, their raw
// forms and the conversion intrinsics, bit for bit as the real headers'
// host paths (round to nearest even; NaN becomes the canonical 0x7fff).
// Arithmetic operators are deliberately absent: kernels convert to float,
// compute in fp32, and convert back, which is also what the real code does.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16_raw {
  unsigned short x;
};
struct __half_raw {
  unsigned short x;
};

namespace pdserve::gpuemu::detail {

inline unsigned int FloatBits(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsFloat(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// cuda_bf16.hpp __float2bfloat16_rn, host path.
inline unsigned short FloatToBf16Bits(float f) {
  const unsigned int x = FloatBits(f);
  if ((x & 0x7fffffffU) > 0x7f800000U) return 0x7fffU;
  unsigned short r = static_cast<unsigned short>(x >> 16U);
  const unsigned int remainder = x << 16U;
  if (remainder > 0x80000000U || (remainder == 0x80000000U && (r & 1U) != 0U)) ++r;
  return r;
}

inline float Bf16BitsToFloat(unsigned short b) {
  return BitsFloat(static_cast<unsigned int>(b) << 16U);
}

// cuda_fp16.hpp __float2half_rn, host path.
inline unsigned short FloatToHalfBits(float f) {
  const unsigned int x = FloatBits(f);
  unsigned int u = x & 0x7fffffffU;
  const unsigned int sign = (x >> 16U) & 0x8000U;
  unsigned int remainder, result;
  if (u >= 0x7f800000U) {
    remainder = 0U;
    result = u == 0x7f800000U ? (sign | 0x7c00U) : 0x7fffU;
  } else if (u > 0x477fefffU) {
    remainder = 0x80000000U;
    result = sign | 0x7bffU;
  } else if (u >= 0x38800000U) {
    remainder = u << 19U;
    u -= 0x38000000U;
    result = sign | (u >> 13U);
  } else if (u < 0x33000001U) {
    remainder = u;
    result = sign;
  } else {
    const unsigned int exponent = u >> 23U;
    const unsigned int shift = 0x7eU - exponent;
    unsigned int mantissa = (u & 0x7fffffU) | 0x800000U;
    remainder = mantissa << (32U - shift);
    result = (sign | (mantissa >> shift)) & 0xffffU;
  }
  if (remainder > 0x80000000U || (remainder == 0x80000000U && (result & 1U) != 0U)) ++result;
  return static_cast<unsigned short>(result);
}

inline float HalfBitsToFloat(unsigned short h) {
  const unsigned int sign = static_cast<unsigned int>(h & 0x8000U) << 16U;
  unsigned int exponent = (h >> 10U) & 0x1fU;
  unsigned int mantissa = h & 0x3ffU;
  if (exponent == 0x1fU) return BitsFloat(sign | 0x7f800000U | (mantissa << 13U));
  if (exponent == 0U) {
    if (mantissa == 0U) return BitsFloat(sign);
    // Subnormal: normalise.
    exponent = 113U;
    while ((mantissa & 0x400U) == 0U) {
      mantissa <<= 1U;
      --exponent;
    }
    mantissa &= 0x3ffU;
    return BitsFloat(sign | (exponent << 23U) | (mantissa << 13U));
  }
  return BitsFloat(sign | ((exponent + 112U) << 23U) | (mantissa << 13U));
}

}  // namespace pdserve::gpuemu::detail

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  explicit __nv_bfloat16(float f) : __x(pdserve::gpuemu::detail::FloatToBf16Bits(f)) {}
  operator __nv_bfloat16_raw() const { return {__x}; }
  explicit operator float() const { return pdserve::gpuemu::detail::Bf16BitsToFloat(__x); }
};

struct __half {
  unsigned short __x;
  __half() = default;
  constexpr __half(const __half_raw& r) : __x(r.x) {}
  explicit __half(float f) : __x(pdserve::gpuemu::detail::FloatToHalfBits(f)) {}
  operator __half_raw() const { return {__x}; }
  explicit operator float() const { return pdserve::gpuemu::detail::HalfBitsToFloat(__x); }
};

using nv_bfloat16 = __nv_bfloat16;
using half = __half;

inline __nv_bfloat16 __float2bfloat16(float f) {
  return __nv_bfloat16_raw{pdserve::gpuemu::detail::FloatToBf16Bits(f)};
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) {
  return pdserve::gpuemu::detail::Bf16BitsToFloat(b.__x);
}
inline __half __float2half(float f) {
  return __half_raw{pdserve::gpuemu::detail::FloatToHalfBits(f)};
}
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) { return pdserve::gpuemu::detail::HalfBitsToFloat(h.__x); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16_raw{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half_raw{u}; }
