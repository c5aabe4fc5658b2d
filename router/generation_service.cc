#include "router/generation_service.h"

#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/sampling_convert.h"
#include "router/request_validation.h"
#include "router/stop_matcher.h"

namespace pdserve::router {
namespace {

std::string FinishLabel(int reason) {
  switch (static_cast<v1::FinishReason>(reason)) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_CONTEXT:
      return "context";
    default:
      return "unknown";
  }
}

std::string RejectLabel(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "invalid_argument";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "resource_exhausted";
    case grpc::StatusCode::UNAVAILABLE:
      return "unavailable";
    default:
      return "other";
  }
}

// Closes a worker call: the returned status says how it ended.
grpc::Status CancelAndFinish(grpc::ClientContext& ctx,
                             grpc::ClientReader<internal::v1::DecodeEvent>& reader) {
  ctx.TryCancel();
  return reader.Finish();
}

}  // namespace

GenerationService::GenerationService(GenerationOptions options, const PromptSource* prompt_source,
                                     WorkerRegistry* registry, const RoutingPolicy* policy,
                                     RouterMetrics* metrics)
    : options_(options),
      prompt_source_(prompt_source),
      registry_(registry),
      policy_(policy),
      metrics_(metrics),
      seed_counter_(std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)) {}

internal::v1::PrefillWorker::Stub& GenerationService::PrefillStub(const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  auto& stub = prefill_stubs_[address];
  if (!stub) stub = internal::v1::PrefillWorker::NewStub(MakeChannel(address));
  return *stub;
}

internal::v1::DecodeWorker::Stub& GenerationService::DecodeStub(const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  auto& stub = decode_stubs_[address];
  if (!stub) stub = internal::v1::DecodeWorker::NewStub(MakeChannel(address));
  return *stub;
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context,
                                         const v1::GenerateRequest* request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const absl::Time arrival = absl::Now();
  if (draining_.load()) {
    metrics_->CountRejected("draining");
    metrics_->CountFinished("rejected");
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "router is draining");
  }
  if (in_flight_.fetch_add(1) >= options_.max_in_flight) {
    in_flight_.fetch_sub(1);
    metrics_->CountRejected("capacity");
    metrics_->CountFinished("rejected");
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("router at capacity: ", options_.max_in_flight, " requests in flight"));
  }
  metrics_->in_flight.Increment();
  std::string finish_label;
  grpc::Status status = Serve(context, *request, writer, arrival, &finish_label);
  metrics_->in_flight.Decrement();
  in_flight_.fetch_sub(1);
  metrics_->CountEnded(finish_label, !status.ok(), context->IsCancelled(),
                       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  return status;
}

grpc::Status GenerationService::Serve(grpc::ServerContext* context,
                                      const v1::GenerateRequest& request,
                                      grpc::ServerWriter<v1::GenerateResponse>* writer,
                                      absl::Time arrival, std::string* finish_label) {
  absl::StatusOr<ValidatedRequest> req = ValidateRequest(
      request, *prompt_source_, arrival, seed_counter_.fetch_add(0x9E3779B97F4A7C15ull));
  if (!req.ok()) {
    metrics_->CountRejected("invalid_argument");
    *finish_label = "rejected";
    return ToGrpcStatus(req.status());
  }
  const int prompt_len = static_cast<int>(req->prompt.size());
  const std::string& rid = req->request_id;

  // 1. Reserve KV on a decode worker; on refusal try the next one.
  internal::v1::DecodeJob decode_job;
  decode_job.set_request_id(rid);
  decode_job.mutable_prompt_token_ids()->Assign(req->prompt.begin(), req->prompt.end());
  *decode_job.mutable_sampling() = SamplingToProto(req->sampling);

  std::unique_ptr<grpc::ClientContext> decode_ctx;
  std::unique_ptr<grpc::ClientReader<internal::v1::DecodeEvent>> decode_stream;
  internal::v1::DecodeEvent event;
  WorkerDesc decode_worker;
  OutstandingWork decode_work;  // released on every path out
  std::set<std::string> tried;
  grpc::Status last_refusal(grpc::StatusCode::UNAVAILABLE, "no live decode worker");
  while (true) {
    std::vector<WorkerView> pool = registry_->Live(Role::kDecode, absl::Now());
    std::erase_if(pool, [&](const WorkerView& w) { return tried.count(w.desc.id) > 0; });
    std::optional<size_t> pick = policy_->PickDecode(
        pool, {.prompt_tokens = prompt_len, .max_tokens = req->sampling.max_tokens});
    if (!pick) break;
    if (!tried.empty()) metrics_->CountRetry("decode");
    decode_worker = pool[*pick].desc;
    tried.insert(decode_worker.id);
    decode_ctx = grpc::ClientContext::FromServerContext(*context);
    decode_work = registry_->StartWork(decode_worker.id, 0);
    decode_stream = DecodeStub(decode_worker.address).Decode(decode_ctx.get(), decode_job);
    const bool got_event = decode_stream->Read(&event);
    if (got_event && event.has_reserved()) break;
    // A refusal ends the stream with the worker's status; anything else is cut.
    grpc::Status s =
        got_event ? CancelAndFinish(*decode_ctx, *decode_stream) : decode_stream->Finish();
    decode_work.Release();
    decode_stream.reset();
    if (context->IsCancelled())
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      metrics_->CountRejected("invalid_argument");
      *finish_label = "rejected";
      return s;
    }
    PDSERVE_LOG(DEBUG) << "decode worker " << decode_worker.id << " refused " << rid << ": "
                       << s.error_message();
    last_refusal =
        s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "decode worker sent no reservation") : s;
  }
  if (!decode_stream) {
    const bool none = tried.empty();
    metrics_->CountRejected(none ? "no_decode_worker" : RejectLabel(last_refusal.error_code()));
    *finish_label = "rejected";
    if (none) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no live decode worker");
    return grpc::Status(last_refusal.error_code(), absl::StrCat("every decode worker refused: ",
                                                                last_refusal.error_message()));
  }

  // 2. Prefill on the prefill worker the policy picks (the one likely to hold
  // the prompt's prefix, unless loaded); it sends the KV to the decode
  // worker's reservation and answers with the first token.
  std::vector<WorkerView> prefill_pool = registry_->Live(Role::kPrefill, absl::Now());
  const PrefillQuery prefill_query(req->prompt);
  std::optional<size_t> prefill_pick = policy_->PickPrefill(prefill_pool, prefill_query);
  if (!prefill_pick) {
    CancelAndFinish(*decode_ctx, *decode_stream);
    metrics_->CountRejected("no_prefill_worker");
    *finish_label = "rejected";
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no live prefill worker");
  }
  const WorkerDesc prefill_worker = prefill_pool[*prefill_pick].desc;
  internal::v1::PrefillJob prefill_job;
  prefill_job.set_request_id(rid);
  prefill_job.mutable_prompt_token_ids()->Assign(req->prompt.begin(), req->prompt.end());
  *prefill_job.mutable_sampling() = SamplingToProto(req->sampling);
  *prefill_job.mutable_kv_target() = event.reserved().kv_target();
  internal::v1::PrefillResult prefill_result;
  auto prefill_ctx = grpc::ClientContext::FromServerContext(*context);
  const absl::Time dispatch = absl::Now();
  OutstandingWork prefill_work =
      registry_->StartPrefill(prefill_pool[*prefill_pick], prefill_query, absl::Now());
  grpc::Status prefill_status =
      PrefillStub(prefill_worker.address).Prefill(prefill_ctx.get(), prefill_job, &prefill_result);
  prefill_work.Release();
  if (!prefill_status.ok()) {
    CancelAndFinish(*decode_ctx, *decode_stream);
    if (context->IsCancelled())
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    metrics_->CountWorkerFailure("prefill");
    PDSERVE_LOG(WARNING) << "request " << rid << ": prefill on " << prefill_worker.id
                         << " failed: " << prefill_status.error_message();
    return grpc::Status(prefill_status.error_code(),
                        absl::StrCat("prefill failed: ", prefill_status.error_message()));
  }

  // 3. Stream: the first token (time to first token ends when it is sent),
  // then the decode worker's tokens, through incremental detokenization and
  // the stop-string matcher.
  text::IncrementalDetokenizer detok(*prompt_source_->tokenizer);
  StopMatcher stops(req->stop_strings);
  const bool want_logprobs = req->sampling.logprobs >= 0;
  metrics_->prompt_tokens.Increment(prompt_len);
  const double queue_seconds =
      absl::ToDoubleSeconds(dispatch - arrival) + prefill_result.queue_seconds();
  metrics_->queue_time.Observe(queue_seconds);
  int completion_tokens = 0;
  absl::Time first_token_time, last_token_time;
  std::string matched_stop;

  // Sends one message with `ids`; false if the client went away. Sets
  // matched_stop (and sends only up to the matching token) on a stop string.
  using LogprobList = google::protobuf::RepeatedPtrField<internal::v1::SampledLogprobs>;
  auto send_tokens = [&](std::span<const int32_t> ids, const LogprobList& logprobs) {
    v1::GenerateResponse delta;
    delta.set_request_id(rid);
    std::string text;
    for (size_t i = 0; i < ids.size(); ++i) {
      delta.add_token_ids(ids[i]);
      if (want_logprobs && static_cast<int>(i) < logprobs.size()) {
        v1::TokenLogprob* lp = delta.add_logprobs();
        lp->set_token_id(ids[i]);
        lp->set_logprob(logprobs[i].logprob());
        for (int k = 0; k < logprobs[i].top_ids_size() && k < logprobs[i].top_logprobs_size();
             ++k) {
          v1::TopLogprob* top = lp->add_top();
          top->set_token_id(logprobs[i].top_ids(k));
          top->set_logprob(logprobs[i].top_logprobs(k));
        }
      }
      StopMatcher::Result r = stops.Push(detok.Push(ids[i]));
      text += r.text;
      if (r.stopped) {
        matched_stop = r.matched;
        break;
      }
    }
    delta.set_text(std::move(text));
    const int n = delta.token_ids_size();
    if (!writer->Write(delta)) return false;
    const absl::Time now = absl::Now();
    if (completion_tokens == 0) {
      first_token_time = now;
      metrics_->time_to_first_token.Observe(absl::ToDoubleSeconds(now - arrival));
    } else {
      // Tokens that arrive together share one gap.
      metrics_->inter_token_latency.Observe(absl::ToDoubleSeconds(now - last_token_time));
      for (int i = 1; i < n; ++i) metrics_->inter_token_latency.Observe(0);
    }
    last_token_time = now;
    completion_tokens += n;
    metrics_->generation_tokens.Increment(n);
    return true;
  };

  // The last message: remaining text, finish reason, usage and timings.
  auto finish = [&](v1::FinishReason reason) {
    const absl::Time end = absl::Now();
    v1::GenerateResponse last;
    last.set_request_id(rid);
    last.set_text(matched_stop.empty() ? stops.Push(detok.Flush()).text + stops.Flush() : "");
    last.set_finish_reason(reason);
    last.set_matched_stop(matched_stop);
    last.mutable_usage()->set_prompt_tokens(prompt_len);
    last.mutable_usage()->set_completion_tokens(completion_tokens);
    v1::Timings* timings = last.mutable_timings();
    timings->set_queue_seconds(queue_seconds);
    timings->set_time_to_first_token_seconds(absl::ToDoubleSeconds(first_token_time - arrival));
    timings->set_mean_inter_token_seconds(
        completion_tokens > 1
            ? absl::ToDoubleSeconds(last_token_time - first_token_time) / (completion_tokens - 1)
            : 0.0);
    timings->set_e2e_seconds(absl::ToDoubleSeconds(end - arrival));
    timings->set_prefill_worker(prefill_worker.id);
    timings->set_decode_worker(decode_worker.id);
    metrics_->e2e_latency.Observe(absl::ToDoubleSeconds(end - arrival));
    *finish_label = matched_stop.empty() ? FinishLabel(reason) : "stop";
    writer->Write(last);
    return grpc::Status::OK;
  };

  const int32_t first = prefill_result.first_token_id();
  LogprobList first_logprobs;
  *first_logprobs.Add() = prefill_result.first_token_logprobs();
  if (!send_tokens(std::span<const int32_t>(&first, 1), first_logprobs)) {
    CancelAndFinish(*decode_ctx, *decode_stream);
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  if (!matched_stop.empty()) {
    CancelAndFinish(*decode_ctx, *decode_stream);
    return finish(v1::FINISH_REASON_STOP);
  }

  while (decode_stream->Read(&event)) {
    if (event.has_tokens()) {
      const auto& ids = event.tokens().token_ids();
      const auto& lps = event.tokens().logprobs();
      if (!send_tokens(std::span<const int32_t>(ids.data(), static_cast<size_t>(ids.size())),
                       lps)) {
        CancelAndFinish(*decode_ctx, *decode_stream);
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      if (!matched_stop.empty()) {
        // The decode worker frees the request when its call is cancelled.
        CancelAndFinish(*decode_ctx, *decode_stream);
        return finish(v1::FINISH_REASON_STOP);
      }
    } else if (event.has_finished()) {
      decode_stream->Finish();
      return finish(static_cast<v1::FinishReason>(event.finished().finish_reason()));
    }
  }
  grpc::Status s = decode_stream->Finish();
  if (context->IsCancelled())
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  if (s.ok()) s = grpc::Status(grpc::StatusCode::INTERNAL, "decode stream ended without finishing");
  metrics_->CountWorkerFailure("decode");
  PDSERVE_LOG(WARNING) << "request " << rid << ": decode on " << decode_worker.id
                       << " failed: " << s.error_message();
  return grpc::Status(s.error_code(), absl::StrCat("decode failed: ", s.error_message()));
}

}  // namespace pdserve::router
