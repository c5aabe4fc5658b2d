#include "router/registry_service.h"

#include "common/auth.h"
#include "common/grpc_util.h"

namespace pdserve::router {
namespace {
LoadReport FromProto(const internal::v1::WorkerLoad& l) {
  return LoadReport{
      .queued_prompt_tokens = l.queued_prompt_tokens(),
      .queued_requests = l.queued_requests(),
      .running_sequences = l.running_sequences(),
      .free_kv_blocks = l.free_kv_blocks(),
      .total_kv_blocks = l.total_kv_blocks(),
      .draining = l.draining(),
      .cached_block_hashes = {l.cached_block_hashes().begin(), l.cached_block_hashes().end()},
      .progress = l.progress(),
      .has_work = l.has_work(),
      .unhealthy_reason = l.unhealthy_reason().substr(0, 1024),
      .max_batch_tokens = l.max_batch_tokens(),
      .max_queued_requests = l.max_queued_requests(),
      .max_sequences = l.max_sequences(),
      .tokens_per_second = l.tokens_per_second()};
}
}  // namespace

grpc::Status RegistryService::Register(grpc::ServerContext* context,
                                       const internal::v1::RegisterRequest* request,
                                       internal::v1::RegisterResponse* response) {
  if (grpc::Status auth = CheckClusterCredential(*context); !auth.ok()) return auth;
  const internal::v1::WorkerInfo& w = request->worker();
  WorkerDesc desc;
  switch (w.role()) {
    case internal::v1::WORKER_ROLE_PREFILL:
      desc.role = Role::kPrefill;
      break;
    case internal::v1::WORKER_ROLE_DECODE:
      desc.role = Role::kDecode;
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "worker.role must be PREFILL or DECODE");
  }
  desc.id = w.worker_id();
  desc.address = w.address();
  desc.kv_endpoint = w.kv_endpoint();
  desc.model_fingerprint = w.model_fingerprint();
  desc.kv_block_size = w.kv_block_size();
  desc.metrics_address = w.metrics_address();
  desc.kv_headroom_tokens = w.has_kv_headroom_tokens() ? w.kv_headroom_tokens() : -1;
  desc.config_fingerprint = w.config_fingerprint();
  desc.checkpoint_fingerprint = w.checkpoint_fingerprint();
  desc.weight_dtype = w.weight_dtype();
  desc.kv_dtype = w.kv_dtype();
  desc.kv_layout = w.kv_layout();
  desc.backend = w.backend();
  absl::Status s = registry_->Register(desc, FromProto(request->load()), absl::Now());
  if (!s.ok()) return ToGrpcStatus(s);
  response->set_heartbeat_interval_ms(
      static_cast<int>(absl::ToInt64Milliseconds(heartbeat_interval_)));
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* context,
                                        const internal::v1::HeartbeatRequest* request,
                                        internal::v1::HeartbeatResponse* response) {
  if (grpc::Status auth = CheckClusterCredential(*context); !auth.ok()) return auth;
  response->set_known(
      registry_->Heartbeat(request->worker_id(), FromProto(request->load()), absl::Now()));
  return grpc::Status::OK;
}

grpc::Status RegistryService::Deregister(grpc::ServerContext* context,
                                         const internal::v1::DeregisterRequest* request,
                                         internal::v1::DeregisterResponse*) {
  if (grpc::Status auth = CheckClusterCredential(*context); !auth.ok()) return auth;
  registry_->Deregister(request->worker_id());
  return grpc::Status::OK;
}

}  // namespace pdserve::router
