// The block scheduler lets the warps of a block run ahead of each other
// between barriers, in an order drawn from a seed: a shared-memory buffer
// overwritten without a barrier after other warps read it (a
// write-after-read race) gives wrong results, as it may on a GPU. Each seed
// gives the same order on every run, so these tests are deterministic.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "engine/cuda/base/cuda_compat.h"
#include "engine/cuda/device_utils.cuh"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::cuda {
namespace {

using testing::DeviceBuffer;

// BlockAllReduce of device_utils.cuh (sum), with the last barrier, the one
// that protects `partial` from the next call's writes, optional.
__device__ float BlockSum(float v, bool barrier_before_reuse) {
  __shared__ float partial[kWarpSize];
  const unsigned lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const unsigned warps = blockDim.x / kWarpSize;
  v = WarpAllReduce(v, SumOp{});
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? partial[lane] : 0.0f;
    w = WarpAllReduce(w, SumOp{});
    if (lane == 0) partial[0] = w;
  }
  __syncthreads();
  const float result = partial[0];
  if (barrier_before_reuse) __syncthreads();
  return result;
}

// Per thread: the block's sum of x, then of x * x (two reductions through
// the same shared buffer), at out[2 * global thread + 0, 1].
__global__ void TwoSumsKernel(const float* in, float* out, bool barrier_before_reuse) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const float x = in[i];
  const float sum = BlockSum(x, barrier_before_reuse);
  const float sum_sq = BlockSum(x * x, barrier_before_reuse);
  out[2 * i] = sum;
  out[2 * i + 1] = sum_sq;
}

class ScheduleTest : public testing::GpuTest {
 protected:
  void TearDown() override {
    pdserve::gpuemu::SetScheduleSeed(seed_);
    testing::GpuTest::TearDown();
  }
  const uint64_t seed_ = pdserve::gpuemu::ScheduleSeed();
};

constexpr unsigned kBlocks = 8, kThreads = 128;  // 4 warps per block

// Small integers: every sum is exact whatever the order.
std::vector<float> Inputs() {
  std::vector<float> in(kBlocks * kThreads);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7) - 3.0f;
  return in;
}

// Threads of the launch whose two sums differ from the exact ones.
int WrongThreads(const std::vector<float>& in, const std::vector<float>& out) {
  int wrong = 0;
  for (unsigned b = 0; b < kBlocks; ++b) {
    float sum = 0, sum_sq = 0;
    for (unsigned t = 0; t < kThreads; ++t) {
      sum += in[b * kThreads + t];
      sum_sq += in[b * kThreads + t] * in[b * kThreads + t];
    }
    for (unsigned t = 0; t < kThreads; ++t) {
      const unsigned i = b * kThreads + t;
      wrong += out[2 * i] != sum || out[2 * i + 1] != sum_sq;
    }
  }
  return wrong;
}

TEST_F(ScheduleTest, MissingBarrierBeforeSharedBufferReuseGivesWrongSums) {
  const std::vector<float> in = Inputs();
  DeviceBuffer<float> d_in(in), out(2 * in.size());
  for (uint64_t seed : {seed_, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{4}, uint64_t{5}}) {
    SCOPED_TRACE(seed);
    pdserve::gpuemu::SetScheduleSeed(seed);
    ASSERT_EQ(Launch(TwoSumsKernel, {kBlocks, kThreads}, d_in.get(), out.get(), true), cudaSuccess);
    EXPECT_EQ(WrongThreads(in, out.Download()), 0);
    out.Poison();
    ASSERT_EQ(Launch(TwoSumsKernel, {kBlocks, kThreads}, d_in.get(), out.get(), false),
              cudaSuccess);
    // A warp that runs ahead overwrites partial[0] with its share of the
    // second sum before slower warps read the first sum.
    EXPECT_GT(WrongThreads(in, out.Download()), 0);
  }
}

// Per thread, the order in which its warp reached the point after the
// warp-level reduction (one counter per block), at order[global thread].
__global__ void ArrivalKernel(int* counters, int* order) {
  const float v = WarpAllReduce(static_cast<float>(threadIdx.x), SumOp{});
  int arrival = 0;
  if (threadIdx.x % kWarpSize == 0) arrival = atomicAdd(&counters[blockIdx.x], 1);
  arrival = __shfl_sync(0xffffffffu, arrival, 0);
  __syncthreads();
  order[blockIdx.x * blockDim.x + threadIdx.x] = v > 0 ? arrival : -1;  // v: lanes 0..31 sum > 0
}

// Warps finish their shuffles in different orders in different blocks: the
// order is drawn, not fixed by warp index.
TEST_F(ScheduleTest, WarpOrderVariesBetweenBlocks) {
  constexpr unsigned kGrid = 16;
  DeviceBuffer<int> counters(std::vector<int>(kGrid, 0)), order(kGrid * kThreads);
  ASSERT_EQ(Launch(ArrivalKernel, {kGrid, kThreads}, counters.get(), order.get()), cudaSuccess);
  const std::vector<int> o = order.Download();
  std::set<std::vector<int>> orders;
  for (unsigned b = 0; b < kGrid; ++b) {
    std::vector<int> per_warp;
    for (unsigned w = 0; w < kThreads / kWarpSize; ++w)
      per_warp.push_back(o[b * kThreads + w * 32]);
    orders.insert(per_warp);
  }
  EXPECT_GT(orders.size(), 2u);
}

// The same seed gives the same schedule: the racy launch fails the same
// threads on every run.
TEST_F(ScheduleTest, SameSeedSameResult) {
  const std::vector<float> in = Inputs();
  DeviceBuffer<float> d_in(in), out(2 * in.size());
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    pdserve::gpuemu::SetScheduleSeed(7);
    out.Poison();
    ASSERT_EQ(Launch(TwoSumsKernel, {kBlocks, kThreads}, d_in.get(), out.get(), false),
              cudaSuccess);
    const std::vector<float> result = out.Download();
    if (run == 0) {
      first = result;
    } else {
      EXPECT_EQ(result, first);
    }
  }
}

}  // namespace
}  // namespace pdserve::cuda
