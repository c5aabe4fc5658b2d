#include "prefill_worker/prefill_service.h"

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "frontend/sampling_wire.h"

namespace pdserve::prefill {

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const internal::v1::PrefillJob* job,
                                     internal::v1::PrefillResult* result) {
  if (grpc::Status auth = CheckClusterCredential(*context); !auth.ok()) return auth;
  if (draining()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker is draining");
  if (job->prompt_token_ids_size() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids is empty");
  }
  if (absl::Status s =
          CheckJobLists(job->prompt_token_ids_size(), job->generated_token_ids_size(),
                        job->sampling(), engine_->model_config().max_position_embeddings);
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (job->kv_target().endpoint().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "kv_target.endpoint is empty");
  }
  auto session = sender_->Open(
      job->kv_target().endpoint(), job->kv_target().transfer_id(),
      engine_->SpecFor(job->prompt_token_ids_size() + job->generated_token_ids_size()));
  if (!session.ok()) {
    return ToGrpcStatus(
        absl::Status(session.status().code(),
                     absl::StrCat("cannot open KV transfer to ", job->kv_target().endpoint(), ": ",
                                  session.status().message())));
  }
  PrefillRequest request{
      .request_id = job->request_id(),
      .prompt = {job->prompt_token_ids().begin(), job->prompt_token_ids().end()},
      .generated = {job->generated_token_ids().begin(), job->generated_token_ids().end()},
      .sampling = SamplingFromProto(job->sampling()),
      .kv_session = std::move(*session)};
  auto ticket = engine_->Submit(std::move(request));
  if (!ticket.ok()) return ToGrpcStatus(ticket.status());

  absl::StatusOr<PrefillOutcome> outcome;
  while (!(*ticket)->Wait(absl::Milliseconds(50), &outcome)) {
    if (context->IsCancelled()) {
      engine_->Cancel(*ticket);
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller");
    }
  }
  if (!outcome.ok()) return ToGrpcStatus(outcome.status());
  result->set_first_token_id(outcome->first_token.token);
  if (job->sampling().logprobs() >= 0) {
    *result->mutable_first_token_logprobs() = LogprobsToProto(outcome->first_token);
  }
  result->set_queue_seconds(outcome->queue_seconds);
  result->set_compute_seconds(outcome->compute_seconds);
  return grpc::Status::OK;
}

}  // namespace pdserve::prefill
