// Helpers for the CUDA tests, which are built twice from the same sources:
// against gpu_emulation (ctest label gpu_emulated) and with the real CUDA
// libraries (label gpu, skipped with a message where no device is usable).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda::testing {

// Whether a missing device must fail the tests rather than skip them
// (PDSERVE_REQUIRE_GPU=1, as tests/gpu/run_on_gpu.sh sets on a GPU machine).
inline bool GpuRequired() {
  const char* v = std::getenv("PDSERVE_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// Skips where cudaGetDeviceCount fails or finds no device (fails instead
// where GpuRequired()); checks after each test that no CUDA error is left
// behind.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      if (GpuRequired()) {
        FAIL() << "PDSERVE_REQUIRE_GPU=1 but no usable CUDA device (" << cudaGetErrorName(e) << ")";
      }
      GTEST_SKIP() << "no usable CUDA device (" << cudaGetErrorName(e) << ": "
                   << cudaGetErrorString(e) << ")";
    }
  }
  void TearDown() override {
    if (IsSkipped()) return;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
};

// GpuTest with a non-blocking stream of its own: work on it is not
// ordered with the legacy stream that DeviceBuffer's copies use, so a test
// must Sync() before reading results (under emulation a missing Sync reads
// poison).
class GpuStreamTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
    GpuTest::TearDown();
  }
  void Sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

  cudaStream_t stream_ = nullptr;
};

// An owned device array of n T, filled with 0xff bytes (NaN for f32, bf16
// and f16) when created and by Poison().
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) {
      EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T)), cudaSuccess);
      Poison();
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    ASSERT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  void Poison() {
    if (n_ > 0) {
      EXPECT_EQ(cudaMemset(p_, 0xff, n_ * sizeof(T)), cudaSuccess);
    }
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}
inline std::vector<float> FromBf16(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}
// Values exactly representable in bf16 (the inputs every kernel test uses,
// so the CPU reference sees the same numbers as the device).
inline std::vector<float> RoundToBf16(std::vector<float> v) {
  for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
  return v;
}
inline std::vector<__half> ToF16(const std::vector<float>& v) {
  std::vector<__half> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2half(v[i]);
  return out;
}

// Normalised mean squared error sum((a-b)^2) / sum(b^2), b the reference
// (as llama.cpp's test-backend-ops); infinite if a holds a NaN or the sizes
// differ.
inline double Nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double err = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(ref[i])) return INFINITY;
    if (std::isnan(a[i])) continue;
    const double d = static_cast<double>(a[i]) - ref[i];
    err += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm == 0 ? err : err / norm;
}

// Error bounds per output dtype: fp32 outputs differ from the reference
// only by summation order; bf16 outputs carry one rounding (2^-9 relative).
inline constexpr double kNmseF32 = 1e-10;
inline constexpr double kNmseBf16 = 3e-5;

}  // namespace pdserve::cuda::testing
