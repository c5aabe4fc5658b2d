// The emulation's kernel rules trigger where a GPU would punish: missing
// barriers read poison, divergent barriers and warp intrinsics fail the
// launch, oversized launches are refused, fresh memory is poisoned. And
// correct warp-level code gives the values CUDA defines.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cuda/base/cuda_compat.h"
#include "engine/cuda/reuse_poison.h"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::cuda {
namespace {

using testing::DeviceBuffer;
using ::testing::HasSubstr;

// out[i] = in of the neighbour `shift` threads on, through shared memory;
// with_barrier false drops the __syncthreads between write and read.
__global__ void NeighbourKernel(const float* in, float* out, int shift, bool with_barrier) {
  PDSERVE_DYNAMIC_SHARED(float, s);
  const unsigned n = blockDim.x, t = threadIdx.x;
  const unsigned base = blockIdx.x * n;
  s[t] = in[base + t];
  if (with_barrier) __syncthreads();
  out[base + t] = s[(t + n + shift) % n];
}

__global__ void StaticSharedNeighbourKernel(const float* in, float* out, bool with_barrier) {
  __shared__ float s[64];
  const unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * 64 + t];
  if (with_barrier) __syncthreads();
  out[blockIdx.x * 64 + t] = s[(t + 1) % 64];
}

__global__ void DivergentBarrierKernel(float* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// Two barriers the compiler cannot merge into one call.
__global__ void TwoBarrierSitesKernel(float* out) {
  if (threadIdx.x % 2 == 0) {
    out[threadIdx.x] = 1.0f;
    __syncthreads();
  } else {
    __syncthreads();
    out[threadIdx.x] = 2.0f;
  }
}

__global__ void EarlyExitKernel(float* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void PartialShuffleKernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void ShuffleOutsideMaskKernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0x0000ffffu, v, 16);
  out[threadIdx.x] = v;
}

__global__ void BadWidthKernel(float* out) {
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1, 12);
}

// out[4 * t + 0..3]: xor-butterfly sum, down-shifted value, lane-0
// broadcast, and the ballot of odd lanes, per thread of one 64-thread block.
__global__ void WarpOpsKernel(float* out) {
  const unsigned t = threadIdx.x, lane = t % 32;
  float sum = static_cast<float>(t);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float down = __shfl_down_sync(0xffffffffu, static_cast<float>(t), 3);
  const float bcast = __shfl_sync(0xffffffffu, static_cast<float>(t), 0);
  const unsigned ballot = __ballot_sync(0xffffffffu, lane % 2);
  const int any = __any_sync(0xffffffffu, lane == 5);
  const int all = __all_sync(0xffffffffu, lane < 31);
  __syncwarp();
  out[4 * t + 0] = sum;
  out[4 * t + 1] = down;
  out[4 * t + 2] = bcast;
  out[4 * t + 3] = static_cast<float>(ballot == 0xaaaaaaaau) + 2.0f * any + 4.0f * all;
}

__global__ void WriteKernel(float* out) { out[threadIdx.x] = 2.0f; }

// ws[i] = step * 100 + i for i < n.
__global__ void ProduceKernel(float* ws, int n, int step) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < n) ws[i] = static_cast<float>(step * 100 + i);
}
// out[i] = ws[i] for i < n.
__global__ void ConsumeKernel(const float* ws, float* out, int n) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < n) out[i] = ws[i];
}

// Every thread of every block adds to shared counters (blocks run on
// several OS threads).
__global__ void AtomicsKernel(int* count, int* max_id, float* sum) {
  const int id = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(count, 1);
  atomicMax(max_id, id);
  atomicAdd(sum, 0.5f);
}

class StrictnessTest : public testing::GpuTest {
 protected:
  void TearDown() override {
    // Tests that fail launches on purpose leave a sticky error behind.
    cudaDeviceReset();
    testing::GpuTest::TearDown();
  }
};

std::vector<float> Iota(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

TEST_F(StrictnessTest, MissingBarrierReadsPoisonedSharedMemory) {
  constexpr unsigned kThreads = 64, kBlocks = 2;
  DeviceBuffer<float> in(Iota(kThreads * kBlocks)), out(kThreads * kBlocks);
  for (int shift : {1, -1}) {
    SCOPED_TRACE(shift);
    const LaunchDims dims{kBlocks, kThreads, kThreads * sizeof(float)};
    ASSERT_EQ(Launch(NeighbourKernel, dims, in.get(), out.get(), shift, true), cudaSuccess);
    std::vector<float> good = out.Download();
    for (unsigned b = 0; b < kBlocks; ++b) {
      for (unsigned t = 0; t < kThreads; ++t) {
        ASSERT_EQ(good[b * kThreads + t], b * kThreads + (t + kThreads + shift) % kThreads);
      }
    }
    out.Poison();
    ASSERT_EQ(Launch(NeighbourKernel, dims, in.get(), out.get(), shift, false), cudaSuccess);
    const std::vector<float> racy = out.Download();
    int poisoned = 0;
    for (float x : racy) poisoned += std::isnan(x);
    // Whichever way the read looks, some block runs the readers first.
    EXPECT_GT(poisoned, 0);
  }
}

// Static shared arrays live on across launches on each worker thread, so a
// racy read may see the last launch's data; the racy launch therefore reads
// different input, and any stale value (old input, or zeroes on a fresh
// worker thread) differs from what the barrier would give.
TEST_F(StrictnessTest, MissingBarrierOnStaticSharedMemoryGivesWrongValues) {
  std::vector<float> second = Iota(128);
  for (float& x : second) x += 1000.0f;
  DeviceBuffer<float> in(Iota(128)), in2(second), out(128);
  ASSERT_EQ(Launch(StaticSharedNeighbourKernel, {2, 64}, in.get(), out.get(), true), cudaSuccess);
  std::vector<float> good(128);
  for (unsigned i = 0; i < 128; ++i) good[i] = second[i / 64 * 64 + (i % 64 + 1) % 64];
  ASSERT_EQ(Launch(StaticSharedNeighbourKernel, {2, 64}, in2.get(), out.get(), true), cudaSuccess);
  ASSERT_EQ(out.Download(), good);
  ASSERT_EQ(Launch(StaticSharedNeighbourKernel, {2, 64}, in.get(), out.get(), true), cudaSuccess);
  ASSERT_EQ(Launch(StaticSharedNeighbourKernel, {2, 64}, in2.get(), out.get(), false), cudaSuccess);
  EXPECT_NE(out.Download(), good);
}

// Runs a one-block launch that must fail; returns the emulation's message.
std::string ExpectLaunchFailure(void (*kernel)(float*), unsigned threads) {
  DeviceBuffer<float> out(threads);
  EXPECT_EQ(Launch(kernel, {1, threads}, out.get()), cudaSuccess);  // fails asynchronously
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  // Sticky, as on a GPU: later work fails too until the device is reset.
  EXPECT_EQ(Launch(WriteKernel, {1, 1}, out.get()), cudaErrorLaunchFailure);
  std::string message = pdserve::gpuemu::LastFailureMessage();
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(Launch(WriteKernel, {1, 1}, out.get()), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return message;
}

TEST_F(StrictnessTest, BarrierReachedByPartOfTheBlockFailsTheLaunch) {
  EXPECT_THAT(ExpectLaunchFailure(DivergentBarrierKernel, 64),
              HasSubstr("__syncthreads reached by 16 of 64 threads"));
}

TEST_F(StrictnessTest, BarriersAtDifferentCallSitesFailTheLaunch) {
  EXPECT_THAT(ExpectLaunchFailure(TwoBarrierSitesKernel, 64),
              HasSubstr("different __syncthreads call sites"));
}

TEST_F(StrictnessTest, ThreadExitingWhileOthersWaitFailsTheLaunch) {
  EXPECT_THAT(ExpectLaunchFailure(EarlyExitKernel, 64), HasSubstr("1 exited while others wait"));
}

TEST_F(StrictnessTest, ShuffleReachedByHalfTheWarpFailsTheLaunch) {
  EXPECT_THAT(ExpectLaunchFailure(PartialShuffleKernel, 64), HasSubstr("__shfl_xor_sync"));
}

TEST_F(StrictnessTest, ShuffleReadingOutsideItsMaskFailsTheLaunch) {
  EXPECT_THAT(ExpectLaunchFailure(ShuffleOutsideMaskKernel, 32), HasSubstr("outside the mask"));
}

TEST_F(StrictnessTest, FullMaskOnAPartialWarpFailsTheLaunch) {
  EXPECT_THAT(ExpectLaunchFailure(WarpOpsKernel, 48), HasSubstr("does not exist"));
}

TEST_F(StrictnessTest, ShuffleWidthMustBeAPowerOfTwo) {
  EXPECT_THAT(ExpectLaunchFailure(BadWidthKernel, 32), HasSubstr("not a power of two"));
}

TEST_F(StrictnessTest, WarpIntrinsicsGiveCudaResults) {
  DeviceBuffer<float> out(4 * 64);
  ASSERT_EQ(Launch(WarpOpsKernel, {1, 64}, out.get()), cudaSuccess);
  const std::vector<float> r = out.Download();
  for (unsigned t = 0; t < 64; ++t) {
    const unsigned warp = t / 32, lane = t % 32;
    const float warp_sum = 32.0f * 32.0f * warp + 31.0f * 32.0f / 2.0f;
    EXPECT_EQ(r[4 * t + 0], warp_sum) << t;
    EXPECT_EQ(r[4 * t + 1], lane + 3 < 32 ? t + 3 : t) << t;  // own value past the end
    EXPECT_EQ(r[4 * t + 2], 32.0f * warp) << t;
    EXPECT_EQ(r[4 * t + 3], 1.0f + 2.0f) << t;  // ballot of odd lanes, any, not all
  }
}

TEST_F(StrictnessTest, AtomicsAreAtomicAcrossBlocks) {
  DeviceBuffer<int> count(std::vector<int>{0}), max_id(std::vector<int>{-1});
  DeviceBuffer<float> sum(std::vector<float>{0.0f});
  ASSERT_EQ(Launch(AtomicsKernel, {64, 128}, count.get(), max_id.get(), sum.get()), cudaSuccess);
  EXPECT_EQ(count.Download()[0], 64 * 128);
  EXPECT_EQ(max_id.Download()[0], 64 * 128 - 1);
  EXPECT_EQ(sum.Download()[0], 64 * 128 * 0.5f);  // exact: multiples of 0.5 below 2^24
}

TEST_F(StrictnessTest, OversizedLaunchesAreRefusedAtOnce) {
  DeviceBuffer<float> out(2048);
  EXPECT_EQ(Launch(WriteKernel, {1, 1025}, out.get()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  EXPECT_EQ(Launch(WriteKernel, {1, dim3(32, 32, 2)}, out.get()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch(WriteKernel, {dim3(1, 65536), 1}, out.get()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch(WriteKernel, {0, 1}, out.get()), cudaErrorInvalidConfiguration);
  cudaGetLastError();

  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.maxThreadsPerBlock, 1024);
  EXPECT_EQ(prop.warpSize, 32);
  // Dynamic shared memory beyond 48 KiB needs the kernel's opt-in, and the
  // opt-in is capped by the device.
  const size_t big = prop.sharedMemPerBlock + 1;
  EXPECT_EQ(Launch(NeighbourKernel, {1, 32, big}, out.get(), out.get(), 0, true),
            cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_EQ(cudaFuncSetAttribute(NeighbourKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(big)),
            cudaSuccess);
  EXPECT_EQ(Launch(NeighbourKernel, {1, 32, big}, out.get(), out.get(), 0, true), cudaSuccess);
  EXPECT_EQ(cudaFuncSetAttribute(NeighbourKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(prop.sharedMemPerBlockOptin + 1)),
            cudaErrorInvalidValue);
  cudaGetLastError();
  // The attribute lives as long as the process: back to the default.
  EXPECT_EQ(cudaFuncSetAttribute(NeighbourKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(prop.sharedMemPerBlock)),
            cudaSuccess);
}

TEST_F(StrictnessTest, FreshAllocationsArePoisoned) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1000), cudaSuccess);
  std::vector<unsigned char> bytes(1000);
  ASSERT_EQ(cudaMemcpy(bytes.data(), p, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (unsigned char b : bytes) ASSERT_EQ(b, 0xff);
  float f;
  std::memcpy(&f, bytes.data(), sizeof f);
  EXPECT_TRUE(std::isnan(f));
  EXPECT_TRUE(std::isnan(__bfloat162float(__ushort_as_bfloat16(0xffff))));
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// A workspace reused from step to step, and a planted bug: the second step
// produces 32 values but consumes 64. Without poisoning at the step
// boundary the consumer reads the first step's values, plausible numbers,
// and the bug passes; PoisonForReuse (what the CUDA runner calls where it
// reuses memory) makes the stale half NaN.
TEST_F(StrictnessTest, ABufferPoisonedForReuseTurnsStaleReadsIntoNaN) {
  DeviceBuffer<float> ws(64), out(64);
  auto step = [&](int number, bool poison) {
    if (poison) EXPECT_EQ(PoisonForReuse(ws.get(), 64 * sizeof(float), nullptr), cudaSuccess);
    EXPECT_EQ(Launch(ProduceKernel, {1, 64}, ws.get(), number == 1 ? 64 : 32, number), cudaSuccess);
    EXPECT_EQ(Launch(ConsumeKernel, {1, 64}, ws.get(), out.get(), 64), cudaSuccess);
    return out.Download();
  };
  step(1, false);
  const std::vector<float> stale = step(2, false);
  EXPECT_EQ(stale[40], 140.0f);  // the first step's value: the bug goes unseen
  step(1, true);
  const uint64_t before = pdserve::gpuemu::ReusePoisonedBytes();
  const std::vector<float> poisoned = step(2, true);
  EXPECT_EQ(pdserve::gpuemu::ReusePoisonedBytes() - before, 64 * sizeof(float));
  EXPECT_EQ(poisoned[31], 231.0f);
  for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(poisoned[i])) << i;
  // Only ranges inside one live allocation of the right kind.
  EXPECT_EQ(PoisonForReuse(ws.get(), 65 * sizeof(float), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(PoisonHostForReuse(ws.get(), 4), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_F(StrictnessTest, CopiesOutsideAllocationsAreRefused) {
  DeviceBuffer<float> buf(16);
  std::vector<float> host(32);
  EXPECT_EQ(cudaMemcpy(buf.get(), host.data(), 17 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), buf.get() + 1, 16 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  // A host pointer named as device memory.
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 16, 4, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidDevicePointer);
  cudaGetLastError();
}

}  // namespace
}  // namespace pdserve::cuda
