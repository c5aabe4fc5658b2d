#include "router/disaggregated_orchestrator.h"

#include <deque>
#include <set>

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

// One Decode call (one attempt at a decode worker). Lives until OnDone.
class DecodeCall final : public grpc::ClientReadReactor<DecodeEvent> {
 public:
  DecodeCall(DisaggregatedGeneration* owner, WorkerDesc worker, internal::v1::DecodeJob job,
             absl::Time deadline)
      : owner_(owner), worker_(std::move(worker)), job_(std::move(job)) {
    if (deadline != absl::InfiniteFuture()) context_.set_deadline(absl::ToChronoTime(deadline));
  }

  void Begin(internal::v1::DecodeWorker::Stub& stub) {
    stub.async()->Decode(&context_, &job_, this);
    StartRead(&event_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }
  const WorkerDesc& worker() const { return worker_; }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  DisaggregatedGeneration* const owner_;
  const WorkerDesc worker_;
  grpc::ClientContext context_;
  const internal::v1::DecodeJob job_;
  DecodeEvent event_;
};

class DisaggregatedGeneration final : public frontend::Generation {
 public:
  DisaggregatedGeneration(DisaggregatedOrchestrator* orchestrator, frontend::GenerationJob job)
      : orchestrator_(orchestrator), job_(std::move(job)), start_(absl::Now()) {}

  ~DisaggregatedGeneration() override {
    Cancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &DisaggregatedGeneration::CallsDoneLocked));
  }

  // Placement: reserve on a decode worker, dispatch the prefill.
  absl::Status Place();

  absl::Status Next(absl::Duration timeout, std::vector<GenerationEvent>* out) override {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &DisaggregatedGeneration::NextReadyLocked), timeout);
    while (!ready_.empty()) {
      out->push_back(std::move(ready_.front()));
      ready_.pop_front();
    }
    if (!out->empty()) return absl::OkStatus();
    if (!failure_.ok()) return failure_;
    if (cancelled_) return absl::CancelledError("cancelled");
    return absl::OkStatus();
  }

  void Cancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return;
      cancelled_ = true;
    }
    // Outside mu_: gRPC may run reactions from TryCancel.
    if (decode_ != nullptr) decode_->Cancel();
    if (prefill_sent_) prefill_context_.TryCancel();
  }

  frontend::Placement placement() const override {
    absl::MutexLock lock(&mu_);
    return placement_;
  }

  // DecodeCall's reactions.
  void OnDecodeEvent(DecodeEvent event);
  void OnDecodeDone(const grpc::Status& status);

 private:
  bool CallsDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (decode_ == nullptr || decode_done_) && (!prefill_sent_ || prefill_done_);
  }
  bool NextReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() || !failure_.ok() || cancelled_;
  }
  bool DecodeAnsweredLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reserved_ || decode_done_;
  }
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (failure_.ok() && !cancelled_) failure_ = std::move(status);
  }
  // Queues an event in order: held back until the first token is out.
  void QueueLocked(GenerationEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    (first_token_out_ ? ready_ : held_).push_back(std::move(event));
  }
  void OnPrefillDone(const grpc::Status& status);

  DisaggregatedOrchestrator* const orchestrator_;
  const frontend::GenerationJob job_;
  const absl::Time start_;

  mutable absl::Mutex mu_;
  // The accepted decode call, or the attempt in flight during Place. Set and
  // reset only by Place (before any other thread sees the generation).
  std::unique_ptr<DecodeCall> decode_;
  OutstandingWork decode_work_;  // released with the generation
  bool decode_done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status decode_status_ ABSL_GUARDED_BY(mu_);
  bool reserved_ ABSL_GUARDED_BY(mu_) = false;
  bool decode_finished_ ABSL_GUARDED_BY(mu_) = false;
  internal::v1::KvTarget kv_target_ ABSL_GUARDED_BY(mu_);

  // The Prefill call; prefill_sent_ is set by Place before the call starts.
  grpc::ClientContext prefill_context_;
  internal::v1::PrefillJob prefill_job_;
  internal::v1::PrefillResult prefill_result_;
  bool prefill_sent_ = false;
  WorkerDesc prefill_worker_;
  OutstandingWork prefill_work_ ABSL_GUARDED_BY(mu_);  // released when the call ends
  absl::Time dispatch_;
  bool prefill_done_ ABSL_GUARDED_BY(mu_) = false;

  bool first_token_out_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<GenerationEvent> ready_ ABSL_GUARDED_BY(mu_);
  std::deque<GenerationEvent> held_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  frontend::Placement placement_ ABSL_GUARDED_BY(mu_);
};

void DecodeCall::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  owner_->OnDecodeEvent(std::move(event_));
  event_.Clear();
  StartRead(&event_);
}

void DecodeCall::OnDone(const grpc::Status& status) { owner_->OnDecodeDone(status); }

void DisaggregatedGeneration::OnDecodeEvent(DecodeEvent event) {
  absl::MutexLock lock(&mu_);
  switch (event.event_case()) {
    case DecodeEvent::kReserved:
      reserved_ = true;
      kv_target_ = event.reserved().kv_target();
      return;
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
      decode_finished_ = true;
      GenerationEvent out;
      out.finished = true;
      out.finish_reason = static_cast<engine::FinishReason>(event.finished().finish_reason());
      QueueLocked(std::move(out));
      return;
    }
    case DecodeEvent::EVENT_NOT_SET:
      return;
  }
}

void DisaggregatedGeneration::OnDecodeDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  decode_done_ = true;
  decode_status_ = status;
  if (!reserved_ || decode_finished_) return;  // a refusal (Place reads it), or the end
  const std::string& id = decode_->worker().id;
  if (!cancelled_) orchestrator_->metrics().CountWorkerFailure("decode");
  if (status.ok()) {
    FailLocked(absl::InternalError(
        absl::StrCat("decode on ", id, " failed: the stream ended without finishing")));
  } else {
    FailLocked(absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                            absl::StrCat("decode failed: ", status.error_message())));
  }
}

void DisaggregatedGeneration::OnPrefillDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  prefill_done_ = true;
  prefill_work_.Release();
  if (!status.ok()) {
    if (!cancelled_) {
      orchestrator_->metrics().CountWorkerFailure("prefill");
      PDSERVE_LOG(WARNING) << "request " << job_.request_id << ": prefill on " << prefill_worker_.id
                           << " failed: " << status.error_message();
    }
    FailLocked(absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                            absl::StrCat("prefill failed: ", status.error_message())));
    return;
  }
  GenerationEvent first;
  first.tokens.push_back(prefill_result_.first_token_id());
  if (job_.sampling.logprobs >= 0) {
    first.logprobs.push_back(LogprobsFromProto(prefill_result_.first_token_id(),
                                               prefill_result_.first_token_logprobs()));
  }
  first.queue_seconds = absl::ToDoubleSeconds(dispatch_ - start_) + prefill_result_.queue_seconds();
  ready_.push_back(std::move(first));
  while (!held_.empty()) {
    ready_.push_back(std::move(held_.front()));
    held_.pop_front();
  }
  first_token_out_ = true;
}

absl::Status DisaggregatedGeneration::Place() {
  WorkerRegistry& registry = orchestrator_->registry();
  const int prompt_len = static_cast<int>(job_.prompt.size());
  internal::v1::DecodeJob decode_job;
  decode_job.set_request_id(job_.request_id);
  decode_job.mutable_prompt_token_ids()->Assign(job_.prompt.begin(), job_.prompt.end());
  *decode_job.mutable_sampling() = SamplingToProto(job_.sampling);

  // 1. Reserve KV on a decode worker; on refusal try the next one.
  std::set<std::string> tried;
  grpc::Status last_refusal(grpc::StatusCode::UNAVAILABLE, "no live decode worker");
  while (true) {
    std::vector<WorkerView> pool = registry.Live(Role::kDecode, absl::Now());
    std::erase_if(pool, [&](const WorkerView& w) { return tried.count(w.desc.id) > 0; });
    std::optional<size_t> pick = orchestrator_->policy()->PickDecode(
        pool, {.prompt_tokens = prompt_len, .max_tokens = job_.sampling.max_tokens});
    if (!pick) break;
    if (!tried.empty()) orchestrator_->metrics().CountRetry("decode");
    const WorkerDesc worker = pool[*pick].desc;
    tried.insert(worker.id);
    decode_work_ = registry.StartWork(worker.id, 0);
    {
      absl::MutexLock lock(&mu_);
      decode_done_ = false;
      reserved_ = false;
    }
    decode_ = std::make_unique<DecodeCall>(this, worker, decode_job, job_.deadline);
    decode_->Begin(orchestrator_->DecodeStub(worker.address));
    grpc::Status refusal;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &DisaggregatedGeneration::DecodeAnsweredLocked));
      if (reserved_) break;
      refusal = decode_status_;
    }
    decode_work_.Release();
    decode_.reset();  // done: OnDone ran
    if (refusal.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return frontend::WithRejectReason(FromGrpcStatus(refusal), "invalid_argument");
    }
    if (refusal.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return FromGrpcStatus(refusal);
    }
    PDSERVE_LOG(DEBUG) << "decode worker " << worker.id << " refused " << job_.request_id << ": "
                       << refusal.error_message();
    last_refusal =
        refusal.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "decode worker sent no reservation")
                     : refusal;
  }
  if (decode_ == nullptr) {
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
  // reservation and answers with the first token.
  std::vector<WorkerView> prefill_pool = registry.Live(Role::kPrefill, absl::Now());
  const PrefillQuery prefill_query(job_.prompt);
  std::optional<size_t> prefill_pick =
      orchestrator_->policy()->PickPrefill(prefill_pool, prefill_query);
  if (!prefill_pick) {
    // The destructor cancels the reservation.
    return frontend::WithRejectReason(absl::UnavailableError("no live prefill worker"),
                                      "no_prefill_worker");
  }
  prefill_worker_ = prefill_pool[*prefill_pick].desc;
  prefill_job_.set_request_id(job_.request_id);
  prefill_job_.mutable_prompt_token_ids()->Assign(job_.prompt.begin(), job_.prompt.end());
  *prefill_job_.mutable_sampling() = decode_job.sampling();
  {
    absl::MutexLock lock(&mu_);
    *prefill_job_.mutable_kv_target() = kv_target_;
    placement_ = {.prefill_worker = prefill_worker_.id, .decode_worker = decode_->worker().id};
  }
  if (job_.deadline != absl::InfiniteFuture()) {
    prefill_context_.set_deadline(absl::ToChronoTime(job_.deadline));
  }
  dispatch_ = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    prefill_work_ = registry.StartPrefill(prefill_pool[*prefill_pick], prefill_query, absl::Now());
  }
  prefill_sent_ = true;
  orchestrator_->PrefillStub(prefill_worker_.address)
      .async()
      ->Prefill(&prefill_context_, &prefill_job_, &prefill_result_,
                [this](grpc::Status status) { OnPrefillDone(status); });
  return absl::OkStatus();
}

}  // namespace

DisaggregatedOrchestrator::DisaggregatedOrchestrator(WorkerRegistry* registry,
                                                     const RoutingPolicy* policy,
                                                     RouterMetrics* metrics)
    : registry_(registry), policy_(policy), metrics_(metrics) {}

internal::v1::PrefillWorker::Stub& DisaggregatedOrchestrator::PrefillStub(
    const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  auto& stub = prefill_stubs_[address];
  if (!stub) stub = internal::v1::PrefillWorker::NewStub(MakeChannel(address));
  return *stub;
}

internal::v1::DecodeWorker::Stub& DisaggregatedOrchestrator::DecodeStub(
    const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  auto& stub = decode_stubs_[address];
  if (!stub) stub = internal::v1::DecodeWorker::NewStub(MakeChannel(address));
  return *stub;
}

absl::StatusOr<std::unique_ptr<frontend::Generation>> DisaggregatedOrchestrator::Start(
    frontend::GenerationJob job) {
  auto generation = std::make_unique<DisaggregatedGeneration>(this, std::move(job));
  if (absl::Status s = generation->Place(); !s.ok()) return s;
  return generation;
}

}  // namespace pdserve::router
