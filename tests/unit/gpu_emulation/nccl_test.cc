// Emulated NCCL point-to-point between two ranks of this process over
// loopback: issue-order matching, groups, non-blocking init, and a watchdog
// that aborts a communicator whose peer never posts its side. NCCL refuses
// two ranks on one GPU, so these tests have no real-GPU twin.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "engine/cuda/base/nccl_compat.h"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::cuda {
namespace {

using testing::DeviceBuffer;
using Clock = std::chrono::steady_clock;

// Polls ncclCommGetAsyncError until it returns `want` or 10 s pass.
bool AwaitAsyncError(ncclComm_t comm, ncclResult_t want) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  ncclResult_t r = ncclInProgress;
  while (Clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return false;
    if (r == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

class NcclTest : public testing::GpuTest {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    ASSERT_EQ(ncclGetUniqueId(&id_), ncclSuccess);
    for (cudaStream_t& s : streams_) {
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    }
  }
  void TearDown() override {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    testing::GpuTest::TearDown();
  }
  // Both ranks at once (blocking init waits for the other), each on a thread.
  void InitBoth(ncclConfig_t* config = nullptr) {
    ncclResult_t r[2];
    std::thread other([&] { r[1] = ncclCommInitRankConfig(&comms_[1], 2, id_, 1, config); });
    r[0] = ncclCommInitRankConfig(&comms_[0], 2, id_, 0, config);
    other.join();
    const ncclResult_t want =
        config != nullptr && config->blocking == 0 ? ncclInProgress : ncclSuccess;
    ASSERT_EQ(r[0], want);
    ASSERT_EQ(r[1], want);
  }
  // Runs f(rank) for both ranks at once.
  void OnBoth(const std::function<void(int)>& f) {
    std::thread other([&] { f(1); });
    f(0);
    other.join();
  }

  ncclUniqueId id_;
  ncclComm_t comms_[2] = {nullptr, nullptr};
  cudaStream_t streams_[2] = {nullptr, nullptr};
};

std::vector<float> Values(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

TEST_F(NcclTest, SendsAndReceivesMatchInIssueOrder) {
  InitBoth();
  int count = 0, rank = -1;
  ASSERT_EQ(ncclCommCount(comms_[1], &count), ncclSuccess);
  ASSERT_EQ(ncclCommUserRank(comms_[1], &rank), ncclSuccess);
  EXPECT_EQ(count, 2);
  EXPECT_EQ(rank, 1);
  DeviceBuffer<float> a(Values(100, 0)), b(Values(300, 1000)), x(100), y(300);
  ASSERT_EQ(ncclSend(a.get(), 100, ncclFloat32, 1, comms_[0], streams_[0]), ncclSuccess);
  ASSERT_EQ(ncclSend(b.get(), 300, ncclFloat32, 1, comms_[0], streams_[0]), ncclSuccess);
  ASSERT_EQ(ncclRecv(x.get(), 100, ncclFloat32, 0, comms_[1], streams_[1]), ncclSuccess);
  ASSERT_EQ(ncclRecv(y.get(), 300, ncclFloat32, 0, comms_[1], streams_[1]), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(streams_[1]), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(streams_[0]), cudaSuccess);
  EXPECT_EQ(x.Download(), a.Download());
  EXPECT_EQ(y.Download(), b.Download());
  for (ncclComm_t c : comms_) {
    ncclResult_t e;
    ASSERT_EQ(ncclCommGetAsyncError(c, &e), ncclSuccess);
    EXPECT_EQ(e, ncclSuccess);
  }
  EXPECT_EQ(ncclCommDestroy(comms_[0]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms_[1]), ncclSuccess);
}

TEST_F(NcclTest, GroupedExchangeProgressesBothDirections) {
  InitBoth();
  DeviceBuffer<float> out0(Values(64, 0)), out1(Values(64, 500)), in0(64), in1(64);
  OnBoth([&](int r) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    // Send first on both ranks: without the group this deadlocks, as on NCCL.
    ASSERT_EQ(
        ncclSend(r == 0 ? out0.get() : out1.get(), 64, ncclFloat32, 1 - r, comms_[r], streams_[r]),
        ncclSuccess);
    ASSERT_EQ(
        ncclRecv(r == 0 ? in0.get() : in1.get(), 64, ncclFloat32, 1 - r, comms_[r], streams_[r]),
        ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(streams_[r]), cudaSuccess);
  });
  EXPECT_EQ(in0.Download(), out1.Download());
  EXPECT_EQ(in1.Download(), out0.Download());
  EXPECT_EQ(ncclCommDestroy(comms_[0]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms_[1]), ncclSuccess);
}

TEST_F(NcclTest, UngroupedCrossSendsDeadlockUntilAborted) {
  InitBoth();
  DeviceBuffer<float> out0(16), out1(16), in0(16), in1(16);
  for (int r : {0, 1}) {
    ASSERT_EQ(
        ncclSend(r == 0 ? out0.get() : out1.get(), 16, ncclFloat32, 1 - r, comms_[r], streams_[r]),
        ncclSuccess);
    ASSERT_EQ(
        ncclRecv(r == 0 ? in0.get() : in1.get(), 16, ncclFloat32, 1 - r, comms_[r], streams_[r]),
        ncclSuccess);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cudaStreamQuery(streams_[0]), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(streams_[1]), cudaErrorNotReady);
  EXPECT_EQ(ncclCommAbort(comms_[0]), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(comms_[1]), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(streams_[0]), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(streams_[1]), cudaSuccess);
}

TEST_F(NcclTest, NonBlockingInitReportsProgressThenSuccess) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  InitBoth(&config);
  ASSERT_TRUE(AwaitAsyncError(comms_[0], ncclSuccess));
  ASSERT_TRUE(AwaitAsyncError(comms_[1], ncclSuccess));
  DeviceBuffer<int32_t> src(std::vector<int32_t>{1, 2, 3}), dst(3);
  ASSERT_EQ(ncclSend(src.get(), 3, ncclInt32, 1, comms_[0], streams_[0]), ncclSuccess);
  ASSERT_EQ(ncclRecv(dst.get(), 3, ncclInt32, 0, comms_[1], streams_[1]), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(streams_[1]), cudaSuccess);
  EXPECT_EQ(dst.Download(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ncclCommDestroy(comms_[0]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms_[1]), ncclSuccess);
}

TEST_F(NcclTest, WatchdogAbortUnblocksASendWhosePeerNeverReceives) {
  InitBoth();
  DeviceBuffer<float> src(Values(1000, 0));
  ASSERT_EQ(ncclSend(src.get(), 1000, ncclFloat32, 1, comms_[0], streams_[0]), ncclSuccess);
  // The watchdog: the send is still pending after its deadline, the
  // communicator itself reports nothing, so it aborts.
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(cudaStreamQuery(streams_[0]), cudaErrorNotReady);
    ncclResult_t e;
    EXPECT_EQ(ncclCommGetAsyncError(comms_[0], &e), ncclSuccess);
    EXPECT_EQ(e, ncclSuccess);
    EXPECT_EQ(ncclCommAbort(comms_[0]), ncclSuccess);
  });
  EXPECT_EQ(cudaStreamSynchronize(streams_[0]), cudaSuccess);  // unblocked
  watchdog.join();
  // The peer, which holds the announced message, sees the aborted side go.
  EXPECT_TRUE(AwaitAsyncError(comms_[1], ncclRemoteError));
  EXPECT_NE(std::string(ncclGetLastError(comms_[1])), "");
  EXPECT_EQ(ncclCommAbort(comms_[1]), ncclSuccess);
}

TEST_F(NcclTest, OperationsQueuedBehindAStuckSendCompleteAfterAbort) {
  InitBoth();
  DeviceBuffer<float> src(Values(100, 0));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(ncclSend(src.get(), 100, ncclFloat32, 1, comms_[0], streams_[0]), ncclSuccess);
  }
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(ncclCommAbort(comms_[0]), ncclSuccess);
  });
  // The first send is unblocked; the two behind it run on an aborted
  // communicator and complete at once.
  EXPECT_EQ(cudaStreamSynchronize(streams_[0]), cudaSuccess);
  watchdog.join();
  EXPECT_EQ(ncclCommAbort(comms_[1]), ncclSuccess);
}

TEST_F(NcclTest, WatchdogAbortUnblocksAReceiveThatNeverGetsData) {
  InitBoth();
  DeviceBuffer<float> dst(500);
  ASSERT_EQ(ncclRecv(dst.get(), 500, ncclFloat32, 0, comms_[1], streams_[1]), ncclSuccess);
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(cudaStreamQuery(streams_[1]), cudaErrorNotReady);
    EXPECT_EQ(ncclCommAbort(comms_[1]), ncclSuccess);
  });
  EXPECT_EQ(cudaStreamSynchronize(streams_[1]), cudaSuccess);
  watchdog.join();
  for (float v : dst.Download()) ASSERT_TRUE(std::isnan(v));  // nothing was written
  EXPECT_EQ(ncclCommDestroy(comms_[0]), ncclSuccess);         // nothing pending on rank 0
}

TEST_F(NcclTest, SizeMismatchIsAnAsyncError) {
  InitBoth();
  DeviceBuffer<float> src(100), dst(50);
  ASSERT_EQ(ncclSend(src.get(), 100, ncclFloat32, 1, comms_[0], streams_[0]), ncclSuccess);
  ASSERT_EQ(ncclRecv(dst.get(), 50, ncclFloat32, 0, comms_[1], streams_[1]), ncclSuccess);
  EXPECT_TRUE(AwaitAsyncError(comms_[1], ncclInvalidUsage));
  EXPECT_EQ(cudaStreamSynchronize(streams_[1]), cudaSuccess);
  EXPECT_EQ(ncclCommAbort(comms_[0]), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(comms_[1]), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(streams_[0]), cudaSuccess);
}

TEST_F(NcclTest, BadArgumentsAreRefused) {
  InitBoth();
  DeviceBuffer<float> buf(10);
  std::vector<float> host(10);
  EXPECT_EQ(ncclSend(buf.get(), 10, ncclFloat32, 2, comms_[0], streams_[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buf.get(), 10, ncclFloat32, 0, comms_[0], streams_[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(host.data(), 10, ncclFloat32, 1, comms_[0], streams_[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buf.get(), 11, ncclFloat32, 1, comms_[0], streams_[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  ncclComm_t bad;
  EXPECT_EQ(ncclCommInitRank(&bad, 2, id_, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(comms_[0]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms_[1]), ncclSuccess);
}

}  // namespace
}  // namespace pdserve::cuda
