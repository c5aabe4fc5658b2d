#include "common/grpc_util.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace pdserve {

absl::StatusOr<GrpcServerHandle> StartGrpcServer(const std::string& host, int port,
                                                 const std::vector<grpc::Service*>& services) {
  static const bool kInitOnce = [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)kInitOnce;

  GrpcServerHandle handle;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(JoinHostPort(host, port), grpc::InsecureServerCredentials(),
                           &handle.port);
  // No SO_REUSEPORT: a second server on a busy port must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  builder.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  handle.server = builder.BuildAndStart();
  if (handle.server == nullptr || handle.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot start gRPC server on ", JoinHostPort(host, port)));
  }
  SetServing(*handle.server, true);
  return handle;
}

void SetServing(grpc::Server& server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(serving);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && (host.empty() || host.front() != '[')) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace pdserve
