// NCCL results as absl::Status (engine/cuda/base/nccl_compat.h), against the
// emulation and the real NCCL library; neither needs a GPU.
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "engine/cuda/base/nccl_compat.h"

namespace pdserve::cuda {
namespace {

TEST(NcclStatusTest, MapsResultsToStatusCodes) {
  EXPECT_TRUE(NcclStatus(ncclSuccess, "send").ok());
  EXPECT_EQ(NcclStatus(ncclRemoteError, "send").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatus(ncclSystemError, "init").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatus(ncclInProgress, "init").code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status usage = NcclStatus(ncclInvalidUsage, "ncclGroupEnd");
  EXPECT_EQ(usage.code(), absl::StatusCode::kInternal);
  EXPECT_NE(usage.message().find("ncclGroupEnd: "), absl::string_view::npos);
}

TEST(NcclStatusTest, LibraryIsNccl228OrLater) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_GE(version, 22800);
}

}  // namespace
}  // namespace pdserve::cuda
