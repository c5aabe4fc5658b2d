// gRPC adapter of the worker registry: registration, heartbeats, departure.
#pragma once

#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "router/worker_registry.h"

namespace pdserve::router {

class RegistryService final : public internal::v1::Registry::Service {
 public:
  RegistryService(WorkerRegistry* registry, absl::Duration heartbeat_interval)
      : registry_(registry), heartbeat_interval_(heartbeat_interval) {}

  grpc::Status Register(grpc::ServerContext* context, const internal::v1::RegisterRequest* request,
                        internal::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const internal::v1::HeartbeatRequest* request,
                         internal::v1::HeartbeatResponse* response) override;
  grpc::Status Deregister(grpc::ServerContext* context, const internal::v1::DeregisterRequest* request,
                          internal::v1::DeregisterResponse* response) override;

 private:
  WorkerRegistry* const registry_;
  const absl::Duration heartbeat_interval_;
};

}  // namespace pdserve::router
