#include "router/disaggregated_orchestrator.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "frontend/errors.h"
#include "frontend/sampling_wire.h"

namespace pdserve::router {
namespace {

using frontend::GenerationEvent;
using internal::v1::DecodeEvent;

class DisaggregatedGeneration;

// One Decode call (one reservation at a decode worker). Owned by its
// generation until the generation is destroyed, which waits for OnDone.
class DecodeCall final : public grpc::ClientReadReactor<DecodeEvent> {
 public:
  DecodeCall(DisaggregatedGeneration* owner, WorkerDesc worker, internal::v1::DecodeJob job,
             absl::Time deadline)
      : owner_(owner), worker_(std::move(worker)), job_(std::move(job)) {
    if (deadline != absl::InfiniteFuture()) context_.set_deadline(absl::ToChronoTime(deadline));
  }

  void Begin(std::shared_ptr<internal::v1::DecodeWorker::Stub> stub) {
    stub_ = std::move(stub);
    stub_->async()->Decode(&context_, &job_, this);
    StartRead(&event_);
    StartCall();
  }
  // Any thread, before or after the call ends.
  void Cancel() { context_.TryCancel(); }
  const WorkerDesc& worker() const { return worker_; }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  // Guarded by the owner's mu_.
  bool done = false;
  grpc::Status status;
  bool reserved = false;
  bool finished = false;
  // Events that came before the call became the attempt's current one (a
  // decode worker may stream before the router has dispatched the prefill);
  // replayed in order when it does.
  std::vector<DecodeEvent> early;
  internal::v1::KvTarget kv_target;
  OutstandingWork work;  // released when the call ends

 private:
  DisaggregatedGeneration* const owner_;
  const WorkerDesc worker_;
  std::shared_ptr<internal::v1::DecodeWorker::Stub> stub_;  // its channel, held for the call
  grpc::ClientContext context_;
  const internal::v1::DecodeJob job_;
  DecodeEvent event_;
};

// One Prefill call. Owned by its generation like a DecodeCall.
struct PrefillCall {
  std::shared_ptr<internal::v1::PrefillWorker::Stub> stub;  // its channel, held for the call
  grpc::ClientContext context;
  internal::v1::PrefillJob job;
  internal::v1::PrefillResult result;
  WorkerDesc worker;
  absl::Time dispatch;
  // Guarded by the owner's mu_.
  bool done = false;
  OutstandingWork work;  // released when the call ends
};

// Why the current attempt ended without finishing the generation.
struct AttemptFailure {
  std::string pool;       // whose call failed or stalled: "prefill" or "decode"
  std::string worker_id;  // avoided by the generation's later attempts
  bool stalled = false;
  // The worker looks gone (connection lost, no answer): the registry stops
  // offering it until it is heard from (WorkerRegistry::ReportFailure).
  bool worker_down = false;
  absl::Status status;           // for the client when no attempt is left
  DecodeCall* decode = nullptr;  // the attempt's calls, cancelled before the next
  PrefillCall* prefill = nullptr;
};

// Codes a worker call ends with when the worker process died, restarted or
// could not be reached (not a refusal of this request).
bool WorkerDown(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::ABORTED:
      return true;
    default:
      return false;
  }
}

bool Retryable(grpc::StatusCode code) {
  return code != grpc::StatusCode::INVALID_ARGUMENT &&
         code != grpc::StatusCode::DEADLINE_EXCEEDED &&
         code != grpc::StatusCode::FAILED_PRECONDITION && code != grpc::StatusCode::OK;
}

// `pool` without the workers in `avoid`, unless none would be left.
void Avoid(std::vector<WorkerView>& pool, const std::set<std::string>& avoid) {
  const size_t n = std::count_if(pool.begin(), pool.end(),
                                 [&](const WorkerView& w) { return avoid.count(w.desc.id) > 0; });
  if (n == 0 || n == pool.size()) return;
  std::erase_if(pool, [&](const WorkerView& w) { return avoid.count(w.desc.id) > 0; });
}

class DisaggregatedGeneration final : public frontend::Generation {
 public:
  DisaggregatedGeneration(DisaggregatedOrchestrator* orchestrator, frontend::GenerationJob job)
      : orchestrator_(orchestrator),
        options_(orchestrator->options()),
        job_(std::move(job)),
        start_(absl::Now()) {}

  ~DisaggregatedGeneration() override {
    Cancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &DisaggregatedGeneration::CallsDoneLocked));
  }

  // The first placement: reserve on a decode worker, dispatch the prefill.
  absl::Status Place() { return StartAttempt(); }

  absl::Status Next(absl::Duration timeout, std::vector<GenerationEvent>* out) override {
    AttemptFailure failure;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(this, &DisaggregatedGeneration::NextReadyLocked),
                           timeout);
      while (!ready_.empty()) {
        out->push_back(std::move(ready_.front()));
        ready_.pop_front();
      }
      if (!out->empty()) return absl::OkStatus();
      if (!failure_.ok()) return failure_;
      if (cancelled_) return absl::CancelledError("cancelled");
      CheckStallLocked(absl::Now());
      if (!attempt_failure_.has_value()) return absl::OkStatus();
      failure = *std::move(attempt_failure_);
      attempt_failure_.reset();
    }
    return Recover(std::move(failure));
  }

  void Cancel() override {
    std::vector<DecodeCall*> decodes;
    std::vector<PrefillCall*> prefills;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return;
      cancelled_ = true;
      for (auto& c : decode_calls_) {
        if (!c->done) decodes.push_back(c.get());
      }
      for (auto& c : prefill_calls_) {
        if (!c->done) prefills.push_back(c.get());
      }
    }
    // Outside mu_: gRPC may run reactions from TryCancel.
    for (DecodeCall* c : decodes) c->Cancel();
    for (PrefillCall* c : prefills) c->context.TryCancel();
  }

  frontend::Placement placement() const override {
    absl::MutexLock lock(&mu_);
    return placement_;
  }

  // DecodeCall's reactions.
  void OnDecodeEvent(DecodeCall* call, DecodeEvent event);
  void HandleDecodeEventLocked(DecodeCall* call, DecodeEvent event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current decode call ended (call->done): the request's end, or a
  // failed attempt.
  void DecodeEndedLocked(DecodeCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDecodeDone(DecodeCall* call, const grpc::Status& status);

 private:
  bool CallsDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& c : decode_calls_) {
      if (!c->done) return false;
    }
    for (const auto& c : prefill_calls_) {
      if (!c->done) return false;
    }
    return true;
  }
  bool NextReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() || !failure_.ok() || cancelled_ || attempt_failure_.has_value();
  }
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (failure_.ok() && !cancelled_) failure_ = std::move(status);
  }
  // Ends the current attempt: its calls' later events are ignored, and the
  // session's next Next starts another attempt (or fails the generation).
  void FailAttemptLocked(AttemptFailure failure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (attempt_failure_.has_value() || cancelled_ || !failure_.ok()) return;
    failure.decode = std::exchange(current_decode_, nullptr);
    failure.prefill = std::exchange(current_prefill_, nullptr);
    attempt_failure_ = std::move(failure);
  }
  // Hands an event of the current attempt to the session, in order: held
  // back until the attempt's first token is out.
  void QueueLocked(GenerationEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (attempt_first_out_) {
      RelayLocked(std::move(event));
    } else {
      held_.push_back(std::move(event));
    }
  }
  void RelayLocked(GenerationEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    generated_.insert(generated_.end(), event.tokens.begin(), event.tokens.end());
    finished_ |= event.finished;
    last_progress_ = absl::Now();
    ready_.push_back(std::move(event));
  }
  // A stall: nothing from the current attempt for the stall timeout.
  void CheckStallLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnPrefillDone(PrefillCall* call, const grpc::Status& status);
  // One attempt from the tokens relayed so far: a reservation on a decode
  // worker (the next one on a refusal), then the prefill.
  absl::Status StartAttempt();
  // Cancels the failed attempt and starts the next one, or fails.
  absl::Status Recover(AttemptFailure failure);

  DisaggregatedOrchestrator* const orchestrator_;
  const OrchestratorOptions& options_;
  const frontend::GenerationJob job_;
  const absl::Time start_;

  // Used by Place and Recover only (one thread at a time: Start's caller,
  // then the session's).
  int attempts_ = 0;
  std::set<std::string> avoid_decode_;
  std::set<std::string> avoid_prefill_;

  mutable absl::Mutex mu_;
  // Every call made, kept until the generation is destroyed.
  std::vector<std::unique_ptr<DecodeCall>> decode_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<PrefillCall>> prefill_calls_ ABSL_GUARDED_BY(mu_);
  // The current attempt's calls; null between a failure and the next attempt.
  DecodeCall* current_decode_ ABSL_GUARDED_BY(mu_) = nullptr;
  PrefillCall* current_prefill_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool attempt_first_out_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<GenerationEvent> held_ ABSL_GUARDED_BY(mu_);
  // The decode call StartAttempt is waiting on or has accepted and not yet
  // made current: its events are kept in DecodeCall::early.
  DecodeCall* pending_decode_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<AttemptFailure> attempt_failure_ ABSL_GUARDED_BY(mu_);
  // When the current attempt was dispatched or last relayed a token.
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_);

  // Tokens handed to the session (ready_ included), in order.
  std::vector<int32_t> generated_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<GenerationEvent> ready_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  frontend::Placement placement_ ABSL_GUARDED_BY(mu_);
};

void DecodeCall::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  owner_->OnDecodeEvent(this, std::move(event_));
  event_.Clear();
  StartRead(&event_);
}

void DecodeCall::OnDone(const grpc::Status& status) { owner_->OnDecodeDone(this, status); }

void DisaggregatedGeneration::OnDecodeEvent(DecodeCall* call, DecodeEvent event) {
  absl::MutexLock lock(&mu_);
  if (event.event_case() == DecodeEvent::kReserved) {
    call->reserved = true;
    call->kv_target = event.reserved().kv_target();
    return;
  }
  if (call != current_decode_) {
    // Not yet current (kept for StartAttempt), or a failed attempt's.
    if (call != pending_decode_) return;
    call->early.push_back(std::move(event));
    return;
  }
  HandleDecodeEventLocked(call, std::move(event));
}

void DisaggregatedGeneration::HandleDecodeEventLocked(DecodeCall* call, DecodeEvent event) {
  switch (event.event_case()) {
    case DecodeEvent::kTokens: {
      GenerationEvent out;
      const auto& tokens = event.tokens();
      out.tokens.assign(tokens.token_ids().begin(), tokens.token_ids().end());
      if (job_.sampling.logprobs >= 0) {
        for (int i = 0; i < tokens.token_ids_size() && i < tokens.logprobs_size(); ++i) {
          out.logprobs.push_back(LogprobsFromProto(tokens.token_ids(i), tokens.logprobs(i)));
        }
      }
      QueueLocked(std::move(out));
      return;
    }
    case DecodeEvent::kFinished: {
      call->finished = true;
      GenerationEvent out;
      out.finished = true;
      out.finish_reason = static_cast<engine::FinishReason>(event.finished().finish_reason());
      QueueLocked(std::move(out));
      return;
    }
    case DecodeEvent::kReserved:
    case DecodeEvent::EVENT_NOT_SET:
      return;
  }
}

void DisaggregatedGeneration::OnDecodeDone(DecodeCall* call, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  call->done = true;
  call->status = status;
  call->work.Release();
  // A refusal (StartAttempt reads it), the end, or a failed attempt's call.
  if (call != current_decode_) return;
  DecodeEndedLocked(call);
}

void DisaggregatedGeneration::DecodeEndedLocked(DecodeCall* call) {
  const grpc::Status status = call->status;
  if (call->finished || cancelled_) return;
  orchestrator_->metrics().CountWorkerFailure("decode");
  const std::string& id = call->worker().id;
  PDSERVE_LOG(WARNING) << "request " << job_.request_id << ": decode on " << id << " failed after "
                       << generated_.size() << " tokens: "
                       << (status.ok() ? "the stream ended without finishing"
                                       : status.error_message());
  absl::Status why = status.ok()
                         ? absl::InternalError(absl::StrCat(
                               "decode on ", id, " failed: the stream ended without finishing"))
                         : absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                        absl::StrCat("decode failed: ", status.error_message()));
  if (!status.ok() && !Retryable(status.error_code())) {
    FailLocked(std::move(why));
    return;
  }
  FailAttemptLocked({.pool = "decode",
                     .worker_id = id,
                     .worker_down = status.ok() || WorkerDown(status),
                     .status = std::move(why)});
}

void DisaggregatedGeneration::OnPrefillDone(PrefillCall* call, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  call->done = true;
  call->work.Release();
  if (call != current_prefill_ || cancelled_) return;
  if (!status.ok()) {
    orchestrator_->metrics().CountWorkerFailure("prefill");
    PDSERVE_LOG(WARNING) << "request " << job_.request_id << ": prefill on " << call->worker.id
                         << " failed: " << status.error_message();
    absl::Status why(static_cast<absl::StatusCode>(status.error_code()),
                     absl::StrCat("prefill failed: ", status.error_message()));
    if (!Retryable(status.error_code())) {
      FailLocked(std::move(why));
      return;
    }
    FailAttemptLocked({.pool = "prefill",
                       .worker_id = call->worker.id,
                       .worker_down = WorkerDown(status),
                       .status = std::move(why)});
    return;
  }
  GenerationEvent first;
  first.tokens.push_back(call->result.first_token_id());
  if (job_.sampling.logprobs >= 0) {
    first.logprobs.push_back(
        LogprobsFromProto(call->result.first_token_id(), call->result.first_token_logprobs()));
  }
  if (generated_.empty()) {
    first.queue_seconds =
        absl::ToDoubleSeconds(call->dispatch - start_) + call->result.queue_seconds();
  }
  RelayLocked(std::move(first));
  while (!held_.empty()) {
    RelayLocked(std::move(held_.front()));
    held_.pop_front();
  }
  attempt_first_out_ = true;
}

void DisaggregatedGeneration::CheckStallLocked(absl::Time now) {
  if (options_.stall_timeout <= absl::ZeroDuration() || finished_ || current_decode_ == nullptr ||
      now - last_progress_ <= options_.stall_timeout) {
    return;
  }
  // Before the attempt's first token the prefill's answer is awaited; after
  // it, the decode stream's next token.
  const bool prefill = !attempt_first_out_ && current_prefill_ != nullptr;
  const std::string pool = prefill ? "prefill" : "decode";
  const std::string id = prefill ? current_prefill_->worker.id : current_decode_->worker().id;
  PDSERVE_LOG(WARNING) << "request " << job_.request_id << ": nothing from " << pool << " worker "
                       << id << " for " << absl::FormatDuration(now - last_progress_)
                       << "; treated as failed";
  FailAttemptLocked(
      {.pool = pool,
       .worker_id = id,
       .stalled = true,
       .worker_down = true,
       .status = absl::UnavailableError(absl::StrCat(
           pool, " worker ", id, " stalled for ", absl::FormatDuration(options_.stall_timeout)))});
}

absl::Status DisaggregatedGeneration::Recover(AttemptFailure failure) {
  // Outside mu_: gRPC may run reactions from TryCancel.
  if (failure.decode != nullptr) failure.decode->Cancel();
  if (failure.prefill != nullptr) failure.prefill->context.TryCancel();
  (failure.pool == "decode" ? avoid_decode_ : avoid_prefill_).insert(failure.worker_id);
  if (failure.worker_down) orchestrator_->registry().ReportFailure(failure.worker_id);
  size_t generated;
  {
    absl::MutexLock lock(&mu_);
    held_.clear();
    attempt_first_out_ = false;
    generated = generated_.size();
    const int count = static_cast<int>(generated);
    engine::FinishReason ended = engine::FinishReason::kNone;
    if (options_.model != nullptr && count > 0) {
      ended = engine::CheckFinish(*options_.model, job_.sampling, generated_.back(), count,
                                  static_cast<int>(job_.prompt.size()) + count);
    } else if (count >= job_.sampling.max_tokens) {
      ended = engine::FinishReason::kLength;
    }
    if (ended != engine::FinishReason::kNone) {
      // The last relayed token ended the run; only the finish was lost.
      RelayLocked({.finished = true, .finish_reason = ended});
      return absl::OkStatus();
    }
  }
  absl::Status status;
  if (attempts_ >= std::max(options_.max_attempts, 1)) {
    status = absl::UnavailableError(absl::StrCat(failure.status.message(), " (attempt ", attempts_,
                                                 " of ", options_.max_attempts, ")"));
  } else if (absl::Now() >= job_.deadline) {
    status = absl::DeadlineExceededError("deadline exceeded while moving the request");
  } else {
    if (generated == 0) {
      orchestrator_->metrics().CountRetry(failure.pool);
    } else {
      orchestrator_->metrics().CountMigration(failure.stalled ? "stalled" : "worker_failed");
    }
    PDSERVE_LOG(INFO) << "request " << job_.request_id << ": "
                      << (generated == 0 ? "retrying" : "migrating") << " after " << generated
                      << " tokens (attempt " << attempts_ + 1 << ")";
    status = StartAttempt();
  }
  if (status.ok()) return status;
  absl::MutexLock lock(&mu_);
  FailLocked(status);
  return failure_.ok() ? absl::CancelledError("cancelled") : failure_;
}

absl::Status DisaggregatedGeneration::StartAttempt() {
  ++attempts_;
  WorkerRegistry& registry = orchestrator_->registry();
  std::vector<int32_t> generated;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("cancelled");
    generated = generated_;
  }
  const int num_generated = static_cast<int>(generated.size());
  internal::v1::DecodeJob decode_job;
  decode_job.set_request_id(job_.request_id);
  decode_job.mutable_prompt_token_ids()->Assign(job_.prompt.begin(), job_.prompt.end());
  decode_job.mutable_generated_token_ids()->Assign(generated.begin(), generated.end());
  *decode_job.mutable_sampling() = SamplingToProto(job_.sampling);
  // Prompt and generated tokens: what the prefill computes and the KV covers.
  std::vector<int32_t> known = job_.prompt;
  known.insert(known.end(), generated.begin(), generated.end());

  // 1. Reserve KV on a decode worker; on refusal try the next one.
  std::set<std::string> tried;
  grpc::Status last_refusal(grpc::StatusCode::UNAVAILABLE, "no live decode worker");
  DecodeCall* accepted = nullptr;
  while (accepted == nullptr) {
    std::vector<WorkerView> pool = registry.Live(Role::kDecode, absl::Now());
    std::erase_if(pool, [&](const WorkerView& w) { return tried.count(w.desc.id) > 0; });
    Avoid(pool, avoid_decode_);
    std::optional<size_t> pick = orchestrator_->policy()->PickDecode(
        pool, {.prompt_tokens = static_cast<int>(known.size()),
               .max_tokens = job_.sampling.max_tokens - num_generated});
    if (!pick) break;
    if (!tried.empty()) orchestrator_->metrics().CountRetry("decode");
    const WorkerDesc worker = pool[*pick].desc;
    tried.insert(worker.id);
    auto owned = std::make_unique<DecodeCall>(this, worker, decode_job, job_.deadline);
    DecodeCall* call = owned.get();
    call->work = registry.StartWork(worker.id, 0);
    {
      absl::MutexLock lock(&mu_);
      decode_calls_.push_back(std::move(owned));
      // Pending from before its first event: a worker may stream tokens
      // right behind the reservation, before this thread wakes up to accept
      // it, and those must be kept.
      pending_decode_ = call;
    }
    call->Begin(orchestrator_->DecodeStub(worker.address));
    // A worker that does not answer (stopped, hung) is given up after the
    // stall timeout; the call's deadline bounds the wait in any case.
    absl::Duration wait = job_.deadline - absl::Now();
    // The request's own deadline, not the worker's silence, ends this wait:
    // running out of it says nothing about the worker.
    const bool deadline_bounds_wait =
        options_.stall_timeout <= absl::ZeroDuration() || wait <= options_.stall_timeout;
    if (options_.stall_timeout > absl::ZeroDuration()) {
      wait = std::min(wait, options_.stall_timeout);
    }
    grpc::Status refusal;
    bool cancelled = false;
    bool timed_out = false;
    {
      absl::MutexLock lock(&mu_);
      auto answered = [call]() { return call->reserved || call->done; };
      const bool in_time = mu_.AwaitWithTimeout(absl::Condition(&answered), wait);
      cancelled = cancelled_;
      if (call->reserved && !cancelled) {
        accepted = call;
        pending_decode_ = call;
        break;
      }
      pending_decode_ = nullptr;  // refused, silent or cancelled
      call->early.clear();
      timed_out = !in_time;
      refusal = in_time ? call->status
                        : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       absl::StrCat("no reservation from ", worker.id, " within ",
                                                    absl::FormatDuration(wait)));
    }
    call->Cancel();  // no effect on a call that ended
    if (cancelled) return absl::CancelledError("cancelled");
    if (timed_out && deadline_bounds_wait) {
      return absl::DeadlineExceededError(
          absl::StrCat("deadline exceeded waiting for a KV reservation from ", worker.id));
    }
    if (refusal.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return frontend::WithRejectReason(FromGrpcStatus(refusal), "invalid_argument");
    }
    if (refusal.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return FromGrpcStatus(refusal);
    }
    if (refusal.error_code() == grpc::StatusCode::UNAVAILABLE) {
      avoid_decode_.insert(worker.id);
      registry.ReportFailure(worker.id);
    }
    PDSERVE_LOG(DEBUG) << "decode worker " << worker.id << " refused " << job_.request_id << ": "
                       << refusal.error_message();
    last_refusal =
        refusal.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "decode worker sent no reservation")
                     : refusal;
  }
  if (accepted == nullptr) {
    if (tried.empty()) {
      return frontend::WithRejectReason(absl::UnavailableError("no live decode worker"),
                                        "no_decode_worker");
    }
    // Counted by its code (resource_exhausted when every worker is full).
    return absl::Status(
        static_cast<absl::StatusCode>(last_refusal.error_code()),
        absl::StrCat("every decode worker refused: ", last_refusal.error_message()));
  }

  // 2. Prefill on the prefill worker the policy picks (the one likely to
  // hold the prompt's prefix, unless loaded); it sends the KV to the
  // reservation and answers with the next token.
  std::vector<WorkerView> prefill_pool = registry.Live(Role::kPrefill, absl::Now());
  Avoid(prefill_pool, avoid_prefill_);
  const PrefillQuery prefill_query(known);
  std::optional<size_t> prefill_pick =
      orchestrator_->policy()->PickPrefill(prefill_pool, prefill_query);
  if (!prefill_pick) {
    {
      absl::MutexLock lock(&mu_);
      pending_decode_ = nullptr;
    }
    accepted->Cancel();
    return frontend::WithRejectReason(absl::UnavailableError("no live prefill worker"),
                                      "no_prefill_worker");
  }
  auto owned = std::make_unique<PrefillCall>();
  PrefillCall* call = owned.get();
  call->worker = prefill_pool[*prefill_pick].desc;
  call->job.set_request_id(job_.request_id);
  call->job.mutable_prompt_token_ids()->Assign(job_.prompt.begin(), job_.prompt.end());
  call->job.mutable_generated_token_ids()->Assign(generated.begin(), generated.end());
  *call->job.mutable_sampling() = decode_job.sampling();
  if (job_.deadline != absl::InfiniteFuture()) {
    call->context.set_deadline(absl::ToChronoTime(job_.deadline));
  }
  bool cancelled = false;
  {
    absl::MutexLock lock(&mu_);
    cancelled = cancelled_;
    if (cancelled) pending_decode_ = nullptr;
  }
  if (cancelled) {
    accepted->Cancel();  // Cancel() may have run before the reservation was made
    return absl::CancelledError("cancelled");
  }
  {
    absl::MutexLock lock(&mu_);
    *call->job.mutable_kv_target() = accepted->kv_target;
    placement_ = {.prefill_worker = call->worker.id, .decode_worker = accepted->worker().id};
    call->dispatch = absl::Now();
    call->work = registry.StartPrefill(prefill_pool[*prefill_pick], prefill_query, call->dispatch);
    current_decode_ = accepted;
    pending_decode_ = nullptr;
    current_prefill_ = call;
    last_progress_ = call->dispatch;
    prefill_calls_.push_back(std::move(owned));
    for (DecodeEvent& event : std::exchange(accepted->early, {})) {
      HandleDecodeEventLocked(accepted, std::move(event));
    }
    if (accepted->done) DecodeEndedLocked(accepted);
  }
  // A Cancel from here on reaches the call (a context cancelled before its
  // call starts cancels the call as it starts).
  call->stub = orchestrator_->PrefillStub(call->worker.address);
  call->stub->async()->Prefill(&call->context, &call->job, &call->result,
                               [this, call](grpc::Status status) { OnPrefillDone(call, status); });
  return absl::OkStatus();
}

}  // namespace

DisaggregatedOrchestrator::DisaggregatedOrchestrator(WorkerRegistry* registry,
                                                     const RoutingPolicy* policy,
                                                     RouterMetrics* metrics,
                                                     OrchestratorOptions options)
    : options_(options), registry_(registry), policy_(policy), metrics_(metrics) {}

std::set<std::string> DisaggregatedOrchestrator::LiveAddresses() {
  std::set<std::string> live;
  const absl::Time now = absl::Now();
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    for (const WorkerView& w : registry_->Live(role, now)) live.insert(w.desc.address);
  }
  return live;
}

void DisaggregatedOrchestrator::PruneStubsLocked(const std::set<std::string>& live) {
  const auto prune = [&live](auto& stubs) {
    std::erase_if(stubs, [&live](const auto& entry) {
      return entry.second.use_count() == 1 && live.count(entry.first) == 0;
    });
  };
  prune(prefill_stubs_);
  prune(decode_stubs_);
}

template <typename Service>
std::shared_ptr<typename Service::Stub> DisaggregatedOrchestrator::CachedStub(
    StubMap<Service>& stubs, const std::string& address) {
  {
    absl::MutexLock lock(&stubs_mu_);
    auto it = stubs.find(address);
    if (it != stubs.end()) return it->second;
  }
  const std::set<std::string> live = LiveAddresses();  // outside stubs_mu_
  absl::MutexLock lock(&stubs_mu_);
  PruneStubsLocked(live);
  auto& stub = stubs[address];
  if (!stub) stub = Service::NewStub(MakeChannel(address));
  return stub;
}

std::shared_ptr<internal::v1::PrefillWorker::Stub> DisaggregatedOrchestrator::PrefillStub(
    const std::string& address) {
  return CachedStub<internal::v1::PrefillWorker>(prefill_stubs_, address);
}

std::shared_ptr<internal::v1::DecodeWorker::Stub> DisaggregatedOrchestrator::DecodeStub(
    const std::string& address) {
  return CachedStub<internal::v1::DecodeWorker>(decode_stubs_, address);
}

int DisaggregatedOrchestrator::channel_count() {
  absl::MutexLock lock(&stubs_mu_);
  return static_cast<int>(prefill_stubs_.size() + decode_stubs_.size());
}

absl::StatusOr<std::unique_ptr<frontend::Generation>> DisaggregatedOrchestrator::Start(
    frontend::GenerationJob job) {
  auto generation = std::make_unique<DisaggregatedGeneration>(this, std::move(job));
  if (absl::Status s = generation->Place(); !s.ok()) return s;
  return generation;
}

}  // namespace pdserve::router
