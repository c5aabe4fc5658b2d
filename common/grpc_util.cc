#include "common/grpc_util.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/client_interceptor.h"

namespace pdserve {
namespace {

// Adds the cluster credential to the initial metadata of every call.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory, which the channel keeps
};

class BearerInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;
};

grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  return args;
}

}  // namespace

absl::StatusOr<GrpcServerHandle> StartGrpcServer(
    const std::string& host, int port, const std::vector<grpc::Service*>& services,
    std::shared_ptr<grpc::ServerCredentials> credentials, int max_receive_message_bytes) {
  static const bool kInitOnce = [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)kInitOnce;

  GrpcServerHandle handle;
  grpc::ServerBuilder builder;
  if (credentials == nullptr) credentials = grpc::InsecureServerCredentials();
  builder.AddListeningPort(JoinHostPort(host, port), credentials, &handle.port);
  // No SO_REUSEPORT: a second server on a busy port must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_receive_message_bytes);
  builder.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  handle.server = builder.BuildAndStart();
  if (handle.server == nullptr || handle.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot start gRPC server on ", JoinHostPort(host, port)));
  }
  grpc::HealthCheckServiceInterface* health = handle.server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(kLivenessService, true);
  SetServing(*handle.server, true);
  return handle;
}

namespace {
std::atomic<bool> g_process_live{false};
std::atomic<bool> g_process_ready{false};
}  // namespace

void SetServing(grpc::Server& server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(serving);
  g_process_live = serving;
  g_process_ready = serving;
}

void SetReady(grpc::Server& server, bool ready) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus("", ready);
  g_process_ready = ready;
}

bool ProcessLive() { return g_process_live; }
bool ProcessReady() { return g_process_ready; }

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
  const std::string& token = ClusterToken();
  const InternalTls& tls = GetInternalTls();
  grpc::ChannelArguments args = ChannelArgs();
  // A peer that restarts (a router, a worker pod) is reconnected within a
  // quarter second of coming back, not after gRPC's default backoff (up to
  // two minutes): workers re-register within a heartbeat of a router
  // restart. (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as
  // the connect timeout, and a TLS handshake on a busy host can outlast a
  // short one.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  if (tls.enabled()) args.SetSslTargetNameOverride(tls.server_name);
  if (token.empty()) return grpc::CreateCustomChannel(address, InternalChannelCredentials(), args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerInterceptorFactory>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, InternalChannelCredentials(), args, std::move(interceptors));
}

std::shared_ptr<grpc::Channel> MakeClientChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return grpc::CreateCustomChannel(address, std::move(credentials), ChannelArgs());
}

}  // namespace pdserve
