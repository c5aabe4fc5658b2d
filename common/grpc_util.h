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
// port cannot be bound. `credentials`: the port's transport security (null:
// plaintext). Internal services check the caller themselves
// (CheckClusterCredential, common/auth.h), so health stays open to probes.
// `max_receive_message_bytes`: gRPC refuses larger messages itself (-1: no
// limit; the services check the size, as pdserve.v1.Generation does).
absl::StatusOr<GrpcServerHandle> StartGrpcServer(
    const std::string& host, int port, const std::vector<grpc::Service*>& services,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr,
    int max_receive_message_bytes = kMaxGrpcMessageBytes);

// A health service name that is SERVING from start until SetServing(false)
// (drain): liveness and startup probes ask for it, so a worker that is alive
// but not registered (router down, wrong token) is not restarted.
inline constexpr char kLivenessService[] = "pdserve.liveness";

// Sets the overall and per-service health (kLivenessService included) to
// SERVING or NOT_SERVING.
void SetServing(grpc::Server& server, bool serving);
// Sets only the overall health (service ""), which readiness probes ask for.
void SetReady(grpc::Server& server, bool ready);
// The same two states for HTTP probes (MetricsServer's /livez and /readyz):
// what the last SetServing / SetReady of any of the process's servers set
// (StartGrpcServer sets SERVING); false before any server starts.
bool ProcessLive();
bool ProcessReady();

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// "host:port" with IPv6 literals bracketed.
std::string JoinHostPort(const std::string& host, int port);

// A plaintext channel with pdserve's message limits. When the process has a
// cluster token (common/auth.h), every call on it carries
// "authorization: Bearer <token>".
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// A channel like MakeChannel's with `credentials` (e.g. TLS to a client port)
// and no cluster token: for clients of the public API.
std::shared_ptr<grpc::Channel> MakeClientChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials);

}  // namespace pdserve
