#include "prefill_worker/prefill_service.h"

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "frontend/sampling_wire.h"

namespace pdserve::prefill {

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const internal::v1::PrefillJob* job,
                                     grpc::ServerWriter<internal::v1::PrefillEvent>* writer) {
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
  const kvtransfer::TransferSpec spec =
      engine_->SpecFor(job->prompt_token_ids_size() + job->generated_token_ids_size());
  const std::vector<int32_t> generated(job->generated_token_ids().begin(),
                                       job->generated_token_ids().end());
  absl::StatusOr<engine::SamplingParams> sampling =
      SamplingForWorker(job->sampling(), generated, grammars_);
  if (!sampling.ok()) return ToGrpcStatus(sampling.status());
  PrefillRequest request{.request_id = job->request_id(),
                         .prompt = {job->prompt_token_ids().begin(), job->prompt_token_ids().end()},
                         .generated = generated,
                         .sampling = *std::move(sampling)};
  auto ticket = engine_->Submit(std::move(request));
  if (!ticket.ok()) return ToGrpcStatus(ticket.status());

  internal::v1::PrefillEvent accepted;
  accepted.mutable_accepted()->set_queue_position((*ticket)->queue_position());
  accepted.mutable_accepted()->set_tokens_ahead((*ticket)->tokens_ahead());
  if (!writer->Write(accepted)) {
    engine_->Cancel(*ticket);
    return grpc::Status(grpc::StatusCode::CANCELLED, "caller went away");
  }
  bool started = false;
  while (true) {
    const PrefillProgress progress = (*ticket)->Await(absl::Milliseconds(50), started);
    if (context->IsCancelled()) {
      engine_->Cancel(*ticket);
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller");
    }
    if (progress.started && !started) {
      started = true;
      internal::v1::PrefillEvent event;
      event.mutable_started();
      writer->Write(event);  // a caller gone shows at the next cancellation check
      // The KV session opens only now that the prompt computes: waiting
      // prompts hold no connection to the decode worker.
      auto session =
          sender_->Open(job->kv_target().endpoint(), job->kv_target().transfer_id(), spec);
      if (!session.ok()) {
        session =
            absl::Status(session.status().code(),
                         absl::StrCat("cannot open KV transfer to ", job->kv_target().endpoint(),
                                      ": ", session.status().message()));
      }
      engine_->AttachKvSession(*ticket, std::move(session));
      continue;
    }
    if (!progress.result.has_value()) continue;
    const absl::StatusOr<PrefillOutcome>& outcome = *progress.result;
    if (!outcome.ok()) return ToGrpcStatus(outcome.status());
    internal::v1::PrefillEvent event;
    internal::v1::PrefillResult* result = event.mutable_result();
    result->set_first_token_id(outcome->first_token.token);
    if (job->sampling().logprobs() >= 0) {
      *result->mutable_first_token_logprobs() = LogprobsToProto(outcome->first_token);
    }
    result->set_queue_seconds(outcome->queue_seconds);
    result->set_compute_seconds(outcome->compute_seconds);
    writer->Write(event);
    return grpc::Status::OK;
  }
}

}  // namespace pdserve::prefill
