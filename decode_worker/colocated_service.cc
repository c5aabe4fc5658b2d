#include "decode_worker/colocated_service.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "common/sampling_convert.h"
#include "common/grpc_util.h"
#include "router/request_validation.h"

namespace pdserve::colocated {
namespace {

std::string FinishLabel(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kContext:
      return "context";
    case engine::FinishReason::kNone:
      return "unknown";
  }
  return "unknown";
}

}  // namespace

ColocatedService::ColocatedService(ColocatedEngine* engine,
                                   const router::PromptSource* prompt_source,
                                   router::RouterMetrics* metrics, std::string worker_id)
    : engine_(engine),
      prompt_source_(prompt_source),
      metrics_(metrics),
      worker_id_(std::move(worker_id)),
      seed_counter_(std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)) {}

grpc::Status ColocatedService::Generate(grpc::ServerContext* context,
                                        const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const absl::Time arrival = absl::Now();
  if (draining_.load()) {
    metrics_->CountRejected("draining");
    metrics_->CountFinished("rejected");
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is draining");
  }
  in_flight_.fetch_add(1);
  metrics_->in_flight.Increment();
  std::string finish_label;
  grpc::Status status = Serve(context, *request, writer, arrival, &finish_label);
  metrics_->in_flight.Decrement();
  in_flight_.fetch_sub(1);
  metrics_->CountEnded(finish_label, !status.ok(), context->IsCancelled(),
                       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  return status;
}

grpc::Status ColocatedService::Serve(grpc::ServerContext* context,
                                     const v1::GenerateRequest& request,
                                     grpc::ServerWriter<v1::GenerateResponse>* writer,
                                     absl::Time arrival, std::string* finish_label) {
  absl::StatusOr<router::ValidatedRequest> req = router::ValidateRequest(
      request, *prompt_source_, arrival, seed_counter_.fetch_add(0x9E3779B97F4A7C15ull));
  if (!req.ok()) {
    metrics_->CountRejected("invalid_argument");
    *finish_label = "rejected";
    return ToGrpcStatus(req.status());
  }
  // The baseline streams tokens and text; the router's stop strings and
  // log-probabilities are not reproduced here.
  if (!req->stop_strings.empty() || req->sampling.logprobs >= 0) {
    metrics_->CountRejected("invalid_argument");
    *finish_label = "rejected";
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "pdserve_colocated supports neither stop strings nor logprobs");
  }
  const int prompt_len = static_cast<int>(req->prompt.size());
  const std::string rid = req->request_id;
  absl::StatusOr<std::shared_ptr<ColocatedStream>> stream = engine_->Submit(ColocatedRequest{
      .request_id = rid, .prompt = std::move(req->prompt), .sampling = std::move(req->sampling)});
  if (!stream.ok()) {
    metrics_->CountRejected(stream.status().code() == absl::StatusCode::kResourceExhausted
                                ? "resource_exhausted"
                                : "invalid_argument");
    *finish_label = "rejected";
    return ToGrpcStatus(stream.status());
  }
  metrics_->prompt_tokens.Increment(prompt_len);

  text::IncrementalDetokenizer detok(*prompt_source_->tokenizer);
  int completion_tokens = 0;
  double queue_seconds = 0;
  absl::Time first_token_time, last_token_time;
  std::vector<ColocatedOutput> outputs;
  while (true) {
    if (context->IsCancelled()) {
      engine_->Cancel(**stream);
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
    outputs.clear();
    if (!(*stream)->Next(absl::Milliseconds(50), &outputs)) continue;
    v1::GenerateResponse delta;
    delta.set_request_id(rid);
    std::string text;
    const ColocatedOutput* finished = nullptr;
    for (const ColocatedOutput& out : outputs) {
      if (!out.error.ok()) {
        engine_->Cancel(**stream);
        return ToGrpcStatus(out.error);
      }
      for (int32_t t : out.tokens) {
        delta.add_token_ids(t);
        text += detok.Push(t);
      }
      if (completion_tokens == 0 && !out.tokens.empty()) queue_seconds = out.queue_seconds;
      if (out.finished) finished = &out;
    }
    const int n = delta.token_ids_size();
    if (finished != nullptr) text += detok.Flush();
    delta.set_text(std::move(text));
    if (n > 0 || finished != nullptr) {
      const absl::Time now = absl::Now();
      if (finished != nullptr) {
        delta.set_finish_reason(FinishReasonToProto(finished->finish_reason));
        delta.mutable_usage()->set_prompt_tokens(prompt_len);
        delta.mutable_usage()->set_completion_tokens(completion_tokens + n);
      }
      // The timings of the final message are known before it is written;
      // TTFT and ITL are observed after the write, as the router does.
      if (n > 0 && completion_tokens == 0) first_token_time = now;
      if (finished != nullptr) {
        v1::Timings* timings = delta.mutable_timings();
        const int total = completion_tokens + n;
        timings->set_queue_seconds(queue_seconds);
        timings->set_time_to_first_token_seconds(absl::ToDoubleSeconds(first_token_time - arrival));
        timings->set_mean_inter_token_seconds(
            total > 1 ? absl::ToDoubleSeconds(now - first_token_time) / (total - 1) : 0.0);
        timings->set_e2e_seconds(absl::ToDoubleSeconds(now - arrival));
        timings->set_prefill_worker(worker_id_);
        timings->set_decode_worker(worker_id_);
      }
      if (!writer->Write(delta)) {
        engine_->Cancel(**stream);
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      if (n > 0) {
        if (completion_tokens == 0) {
          metrics_->time_to_first_token.Observe(absl::ToDoubleSeconds(now - arrival));
          metrics_->queue_time.Observe(queue_seconds);
          for (int i = 1; i < n; ++i) metrics_->inter_token_latency.Observe(0);
        } else {
          metrics_->inter_token_latency.Observe(absl::ToDoubleSeconds(now - last_token_time));
          for (int i = 1; i < n; ++i) metrics_->inter_token_latency.Observe(0);
        }
        metrics_->generation_tokens.Increment(n);
        completion_tokens += n;
        last_token_time = now;
      }
    }
    if (finished != nullptr) {
      metrics_->e2e_latency.Observe(absl::ToDoubleSeconds(absl::Now() - arrival));
      *finish_label = FinishLabel(finished->finish_reason);
      return grpc::Status::OK;
    }
  }
}

}  // namespace pdserve::colocated
