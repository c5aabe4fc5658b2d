#include "common/grpc_util.h"

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve {
namespace {

class NullRegistry final : public internal::v1::Registry::Service {};

TEST(GrpcUtilTest, StartsOnAnEphemeralPortWithHealth) {
  NullRegistry service;
  auto handle = StartGrpcServer("127.0.0.1", 0, {&service});
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_GT(handle->port, 0);
  ASSERT_NE(handle->server->GetHealthCheckService(), nullptr);
  // An unimplemented method answers UNIMPLEMENTED: the server is up.
  auto stub = internal::v1::Registry::NewStub(MakeChannel(JoinHostPort("127.0.0.1", handle->port)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  internal::v1::HeartbeatResponse resp;
  EXPECT_EQ(stub->Heartbeat(&ctx, {}, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);

  // grpc.health.v1 answers SERVING, then NOT_SERVING once draining.
  auto health = grpc::health::v1::Health::NewStub(MakeChannel(JoinHostPort("127.0.0.1", handle->port)));
  for (bool serving : {true, false}) {
    SetServing(*handle->server, serving);
    grpc::ClientContext hctx;
    hctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckResponse hresp;
    ASSERT_TRUE(health->Check(&hctx, {}, &hresp).ok());
    EXPECT_EQ(hresp.status(), serving ? grpc::health::v1::HealthCheckResponse::SERVING
                                      : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  }
  handle->server->Shutdown();
}

TEST(GrpcUtilTest, PortInUseIsUnavailable) {
  NullRegistry a, b;
  auto first = StartGrpcServer("127.0.0.1", 0, {&a});
  ASSERT_TRUE(first.ok());
  auto second = StartGrpcServer("127.0.0.1", first->port, {&b});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  first->server->Shutdown();
}

TEST(GrpcUtilTest, StatusRoundTripsAndHostPortJoins) {
  absl::Status s = absl::ResourceExhaustedError("full");
  EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(s)), s);
  EXPECT_TRUE(FromGrpcStatus(ToGrpcStatus(absl::OkStatus())).ok());
  EXPECT_EQ(JoinHostPort("127.0.0.1", 5), "127.0.0.1:5");
  EXPECT_EQ(JoinHostPort("::1", 5), "[::1]:5");
}

}  // namespace
}  // namespace pdserve
