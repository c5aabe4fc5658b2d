#include "decode_worker/decode_service.h"

#include "common/auth.h"
#include "common/grpc_util.h"
#include "frontend/sampling_wire.h"

namespace pdserve::decode {

grpc::Status DecodeService::Decode(grpc::ServerContext* context, const internal::v1::DecodeJob* job,
                                   grpc::ServerWriter<internal::v1::DecodeEvent>* writer) {
  if (grpc::Status auth = CheckClusterCredential(*context); !auth.ok()) return auth;
  if (draining()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker is draining");
  if (absl::Status s =
          CheckJobLists(job->prompt_token_ids_size(), job->generated_token_ids_size(),
                        job->sampling(), engine_->model_config().max_position_embeddings);
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  const std::vector<int32_t> generated(job->generated_token_ids().begin(),
                                       job->generated_token_ids().end());
  absl::StatusOr<engine::SamplingParams> sampling =
      SamplingForWorker(job->sampling(), generated, grammars_);
  if (!sampling.ok()) return ToGrpcStatus(sampling.status());
  DecodeRequest request{.request_id = job->request_id(),
                        .prompt = {job->prompt_token_ids().begin(), job->prompt_token_ids().end()},
                        .generated = generated,
                        .sampling = *std::move(sampling)};
  // The KV wait ends with the call (its deadline is the request's budget,
  // set by the router, which acts on a stalled transfer first; a grace
  // second keeps the call's own end ahead of a KV timeout here).
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    request.kv_deadline = absl::FromChrono(context->deadline()) + absl::Seconds(1);
  }
  absl::StatusOr<std::shared_ptr<DecodeStream>> stream = engine_->Admit(std::move(request));
  if (!stream.ok()) return ToGrpcStatus(stream.status());

  internal::v1::DecodeEvent reserved;
  reserved.mutable_reserved()->mutable_kv_target()->set_endpoint(engine_->kv_endpoint());
  reserved.mutable_reserved()->mutable_kv_target()->set_transfer_id((*stream)->transfer_id());
  if (!writer->Write(reserved)) {
    engine_->Cancel(**stream);
    return grpc::Status(grpc::StatusCode::CANCELLED, "caller went away");
  }

  std::vector<DecodeOutput> outputs;
  // Tokens not yet written: up to stream_interval_ - 1 of them between
  // writes.
  internal::v1::DecodeEvent tokens;
  while (true) {
    if (context->IsCancelled()) {
      engine_->Cancel(**stream);
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller");
    }
    outputs.clear();
    if (!(*stream)->Next(absl::Milliseconds(50), &outputs)) continue;
    for (DecodeOutput& out : outputs) {
      if (!out.error.ok()) {
        engine_->Cancel(**stream);
        return ToGrpcStatus(out.error);
      }
      for (const engine::SampledToken& t : out.tokens) {
        tokens.mutable_tokens()->add_token_ids(t.token);
        if (job->sampling().logprobs() >= 0)
          *tokens.mutable_tokens()->add_logprobs() = LogprobsToProto(t);
      }
      if (out.finished) {
        if (tokens.tokens().token_ids_size() > 0 && !writer->Write(tokens)) {
          return grpc::Status(grpc::StatusCode::CANCELLED, "caller went away");
        }
        internal::v1::DecodeEvent finished;
        finished.mutable_finished()->set_finish_reason(FinishReasonToProto(out.finish_reason));
        finished.mutable_finished()->set_completion_tokens(out.completion_tokens);
        writer->Write(finished);
        return grpc::Status::OK;
      }
    }
    if (tokens.tokens().token_ids_size() >= stream_interval_) {
      if (!writer->Write(tokens)) {
        engine_->Cancel(**stream);
        return grpc::Status(grpc::StatusCode::CANCELLED, "caller went away");
      }
      tokens.Clear();
    }
  }
}

}  // namespace pdserve::decode
