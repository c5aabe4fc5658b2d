// Emulated streams, events and graphs order work as CUDA does, and a
// missing wait shows up as poisoned data, deterministically: a "gate"
// kernel holds a stream until the host opens it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "engine/cuda/base/cuda_compat.h"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::cuda {
namespace {

using testing::DeviceBuffer;

// Spins until *gate (host memory) becomes non-zero.
__global__ void GateKernel(const int* gate) {
  while (*static_cast<const volatile int*>(gate) == 0) std::this_thread::yield();
}

__global__ void FillKernel(float* out, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

__global__ void AddKernel(float* out, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += value;
}

class StreamsTest : public testing::GpuTest {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    ASSERT_EQ(cudaMallocHost(&gate_, sizeof(int)), cudaSuccess);
    *gate_ = 0;
  }
  void TearDown() override {
    Open();
    cudaFreeHost(gate_);
    testing::GpuTest::TearDown();
  }
  void Open() { std::atomic_ref<int>(*gate_).store(1); }

  int* gate_ = nullptr;
};

constexpr int kN = 256;

TEST_F(StreamsTest, MissingStreamWaitReadsPoison) {
  cudaStream_t producer, consumer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<float> buf(kN);
  std::vector<float> host(kN, 0.0f);

  // No ordering: the consumer's copy runs while the producer is held.
  ASSERT_EQ(Launch(GateKernel, {1, 1, 0, producer}, gate_), cudaSuccess);
  ASSERT_EQ(Launch(FillKernel, {1, kN, 0, producer}, buf.get(), 7.0f, kN), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(host.data(), buf.get(), kN * sizeof(float), cudaMemcpyDeviceToHost, consumer),
      cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  for (float x : host) ASSERT_TRUE(std::isnan(x));
  Open();
  ASSERT_EQ(cudaStreamSynchronize(producer), cudaSuccess);

  // With an event between them the copy sees the data.
  buf.Poison();
  *gate_ = 0;
  cudaEvent_t filled;
  ASSERT_EQ(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(Launch(GateKernel, {1, 1, 0, producer}, gate_), cudaSuccess);
  ASSERT_EQ(Launch(FillKernel, {1, kN, 0, producer}, buf.get(), 7.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(filled, producer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer, filled, 0), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(host.data(), buf.get(), kN * sizeof(float), cudaMemcpyDeviceToHost, consumer),
      cudaSuccess);
  EXPECT_EQ(cudaEventQuery(filled), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(consumer), cudaErrorNotReady);
  Open();
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  for (float x : host) ASSERT_EQ(x, 7.0f);
  EXPECT_EQ(cudaEventQuery(filled), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(filled), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(producer), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(consumer), cudaSuccess);
}

TEST_F(StreamsTest, LegacyDefaultStreamWaitsForBlockingStreamsOnly) {
  cudaStream_t blocking, nonblocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<float> buf(kN);
  std::vector<float> host(kN, 0.0f);

  // A non-blocking stream is not waited for by the legacy stream.
  ASSERT_EQ(Launch(GateKernel, {1, 1, 0, nonblocking}, gate_), cudaSuccess);
  ASSERT_EQ(Launch(FillKernel, {1, kN, 0, nonblocking}, buf.get(), 3.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), buf.get(), kN * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (float x : host) ASSERT_TRUE(std::isnan(x));
  Open();
  ASSERT_EQ(cudaStreamSynchronize(nonblocking), cudaSuccess);

  // A blocking stream is: the synchronous copy waits for the fill.
  buf.Poison();
  *gate_ = 0;
  ASSERT_EQ(Launch(GateKernel, {1, 1, 0, blocking}, gate_), cudaSuccess);
  ASSERT_EQ(Launch(FillKernel, {1, kN, 0, blocking}, buf.get(), 5.0f, kN), cudaSuccess);
  std::thread opener([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Open();
  });
  ASSERT_EQ(cudaMemcpy(host.data(), buf.get(), kN * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  opener.join();
  for (float x : host) ASSERT_EQ(x, 5.0f);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
}

TEST_F(StreamsTest, EventsTimeAndOrder) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start, stop, untimed, never;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&never), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorInvalidResourceHandle);  // unrecorded
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  ASSERT_EQ(Launch(GateKernel, {1, 1, 0, s}, gate_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(stop, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, s), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
  // start completes before the sleep begins and stop after it ends, so the
  // elapsed time is at least the sleep, however the threads are scheduled.
  ASSERT_EQ(cudaEventSynchronize(start), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  Open();
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 29.9f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  // Waiting on an event never recorded is a no-op.
  EXPECT_EQ(cudaStreamWaitEvent(s, never, 0), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGetLastError();
  for (cudaEvent_t e : {start, stop, untimed, never}) EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST_F(StreamsTest, CapturedGraphReplaysItsWork) {
  cudaStream_t s, side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<float> a(kN), b(kN);
  ASSERT_EQ(Launch(FillKernel, {1, kN, 0, s}, a.get(), 0.0f, kN), cudaSuccess);
  ASSERT_EQ(Launch(FillKernel, {1, kN, 0, s}, b.get(), 0.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);

  // a += 1 on the origin; b += 2 on a forked stream that joins back.
  cudaEvent_t fork, join;
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(Launch(AddKernel, {1, kN, 0, s}, a.get(), 1.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
  ASSERT_EQ(Launch(AddKernel, {1, kN, 0, side}, b.get(), 2.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(join, side), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  EXPECT_EQ(cudaEventQuery(join), cudaErrorCapturedEvent);
  cudaGetLastError();
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);

  // Nothing ran during capture.
  for (float x : a.Download()) ASSERT_EQ(x, 0.0f);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (float x : a.Download()) ASSERT_EQ(x, 3.0f);
  for (float x : b.Download()) ASSERT_EQ(x, 6.0f);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
  cudaStreamDestroy(s);
}

TEST_F(StreamsTest, CaptureRejectsUnjoinedForksAndSynchronisation) {
  cudaStream_t s, side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<float> a(kN);
  cudaEvent_t fork;
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  cudaGraph_t graph = nullptr;

  // A forked stream whose work never joins the origin.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
  ASSERT_EQ(Launch(AddKernel, {1, kN, 0, side}, a.get(), 1.0f, kN), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph, nullptr);

  // Synchronising a capturing stream, or allocating, invalidates the capture.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  // Relaxed mode allows the allocation.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 16), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  // The legacy stream may not be captured.
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();
  cudaEventDestroy(fork);
  cudaStreamDestroy(side);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace pdserve::cuda
