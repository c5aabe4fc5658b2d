// gRPC helpers shared by every server: start a server with the health and
// reflection services, and translate between absl::Status and grpc::Status.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace pdserve {

// gRPC messages may carry this much (both directions); KV never travels over
// gRPC, so the default 4 MiB is raised only for long token-id lists.
inline constexpr int kMaxGrpcMessageBytes = 64 << 20;

struct GrpcServerHandle {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (resolves port 0)
};

// Builds and starts a server on host:port with `services` registered, the
// default health service (SERVING) and server reflection. UNAVAILABLE if the
// port cannot be bound.
absl::StatusOr<GrpcServerHandle> StartGrpcServer(const std::string& host, int port,
                                                 const std::vector<grpc::Service*>& services);

// Sets the overall and per-service health to SERVING or NOT_SERVING.
void SetServing(grpc::Server& server, bool serving);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// "host:port" with IPv6 literals bracketed.
std::string JoinHostPort(const std::string& host, int port);

// A channel with pdserve's message limits.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

}  // namespace pdserve
