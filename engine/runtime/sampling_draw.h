// The stateless uniform draw of seeded sampling, shared by the CPU sampler
// (engine/runtime/sampler.cc) and the CUDA sampling kernels (engine/cuda/sampling.cu)
// so both backends draw the same number for the same (seed, step). Plain
// C++ that nvcc also compiles for the device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PDSERVE_HOST_DEVICE __host__ __device__
#else
#define PDSERVE_HOST_DEVICE
#endif

namespace pdserve::engine {

// SplitMix64's finaliser of z + golden ratio: a bijective 64-bit hash.
PDSERVE_HOST_DEVICE inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform double in [0, 1) from (seed, step) only: 53 random bits.
PDSERVE_HOST_DEVICE inline double UniformForStep(uint64_t seed, int step) {
  const uint64_t bits =
      SplitMix64(SplitMix64(seed) ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace pdserve::engine
