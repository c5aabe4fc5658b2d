#include "router/disaggregated_orchestrator.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/grpc_util.h"
#include "frontend/errors.h"
#include "frontend/sampling_wire.h"

namespace pdserve::router {

using frontend::GenerationEvent;
using internal::v1::DecodeEvent;
using internal::v1::PrefillEvent;
using Judgements = std::unordered_map<std::string, WorkerRegistry::WorkerState>;

namespace {

// A worker call ended UNAVAILABLE and its channel is no longer connected:
// the connection broke (the process died, restarted, or cannot be
// reached), as opposed to a worker that answered UNAVAILABLE itself
// (draining, a failed KV transfer).
bool ConnectionLost(const grpc::Status& status, grpc::Channel& channel) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
         channel.GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
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

// A refusal for lack of room on every decode worker (the request waits in
// the admission queue rather than failing).
constexpr char kNoRoomReason[] = "decode_full";

}  // namespace

// One Decode call (one reservation at a decode worker). Owned by its
// generation until the generation is destroyed, which waits for OnDone.
class DecodeCall final : public grpc::ClientReadReactor<DecodeEvent> {
 public:
  DecodeCall(DisaggregatedGeneration* owner, WorkerView worker, internal::v1::DecodeJob job,
             absl::Time deadline)
      : owner_(owner), worker_(std::move(worker)), job_(std::move(job)) {
    if (deadline != absl::InfiniteFuture()) context_.set_deadline(absl::ToChronoTime(deadline));
  }

  void Begin(DisaggregatedOrchestrator::WorkerChannel<internal::v1::DecodeWorker> channel) {
    channel_ = std::move(channel);
    channel_.stub->async()->Decode(&context_, &job_, this);
    StartRead(&event_);
    StartCall();
  }
  // Any thread, before or after the call ends.
  void Cancel() { context_.TryCancel(); }
  const WorkerDesc& worker() const { return worker_.desc; }
  uint64_t incarnation() const { return worker_.incarnation; }
  grpc::Channel& channel() const { return *channel_.channel; }

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
  const WorkerView worker_;
  DisaggregatedOrchestrator::WorkerChannel<internal::v1::DecodeWorker>
      channel_;  // held for the call
  grpc::ClientContext context_;
  const internal::v1::DecodeJob job_;
  DecodeEvent event_;
};

// One Prefill call: `accepted`, `started`, then the first token. Owned by
// its generation like a DecodeCall.
class PrefillCall final : public grpc::ClientReadReactor<PrefillEvent> {
 public:
  PrefillCall(DisaggregatedGeneration* owner, WorkerView worker)
      : worker(std::move(worker)), owner_(owner) {}

  void Begin(DisaggregatedOrchestrator::WorkerChannel<internal::v1::PrefillWorker> ch) {
    channel = std::move(ch);
    channel.stub->async()->Prefill(&context, &job, this);
    StartRead(&event_);
    StartCall();
  }
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  DisaggregatedOrchestrator::WorkerChannel<internal::v1::PrefillWorker>
      channel;  // held for the call
  grpc::ClientContext context;
  internal::v1::PrefillJob job;
  const WorkerView worker;
  absl::Time dispatch;
  // Guarded by the owner's mu_.
  bool done = false;
  bool accepted = false;  // the worker queued the prompt
  std::optional<internal::v1::PrefillResult> result;
  OutstandingWork work;  // released when the call ends

 private:
  DisaggregatedGeneration* const owner_;
  PrefillEvent event_;
};

// Why the current attempt ended without finishing the generation.
struct AttemptFailure {
  std::string pool;       // whose call failed or stalled: "prefill" or "decode"
  std::string worker_id;  // avoided by the generation's later attempts
  bool stalled = false;   // the worker was judged hung
  // The worker, still live, did not answer within the stall timeout, and
  // another one was there to try: nothing is lost, so it is not an attempt.
  bool slow = false;
  // A call found the worker's connection broken: the registry stops
  // offering it until it is heard from (WorkerRegistry::ReportDisconnected).
  bool disconnected = false;
  absl::Status status;           // for the client when no attempt is left
  DecodeCall* decode = nullptr;  // the attempt's calls, cancelled before the next
  PrefillCall* prefill = nullptr;
};

class DisaggregatedGeneration final : public frontend::Generation {
 public:
  DisaggregatedGeneration(DisaggregatedOrchestrator* orchestrator, frontend::GenerationJob job,
                          AdmissionQueue::Ticket ticket)
      : orchestrator_(orchestrator),
        options_(orchestrator->options()),
        job_(std::move(job)),
        ticket_(ticket),
        start_(absl::Now()) {}

  ~DisaggregatedGeneration() override {
    orchestrator_->Forget(this);  // first: no watch or grant reaches it after
    Cancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &DisaggregatedGeneration::CallsDoneLocked));
  }

  AdmissionQueue::Ticket ticket() const { return ticket_; }
  const frontend::GenerationJob& job() const { return job_; }
  AdmissionQuery query() const {
    absl::MutexLock lock(&mu_);
    const int generated = static_cast<int>(generated_.size());
    return {.prompt_tokens = static_cast<int>(job_.prompt.size()) + generated,
            .max_tokens = job_.sampling.max_tokens - generated};
  }

  // The first placement: reserve on a decode worker, dispatch the prefill.
  absl::Status Place() { return StartAttempt(); }
  // Waits in the admission queue from now on (Start, or a worker's refusal
  // for lack of room).
  void SetQueued() {
    absl::MutexLock lock(&mu_);
    queued_ = true;
    granted_ = false;
  }
  // The admission queue: its turn came, or it left the queue unserved.
  void Grant() {
    absl::MutexLock lock(&mu_);
    granted_ = true;
  }
  // It left the queue unserved: its deadline passed, or it waited the
  // longest wait allowed (`why`).
  void ExpireInQueue(absl::Status why) {
    absl::MutexLock lock(&mu_);
    FailLocked(std::move(why));
  }

  absl::Status Next(absl::Duration timeout, std::vector<GenerationEvent>* out) override {
    AttemptFailure failure;
    bool place = false;
    {
      absl::MutexLock lock(&mu_);
      if (ready_callback_ == nullptr || ready_.empty()) {
        mu_.AwaitWithTimeout(absl::Condition(this, &DisaggregatedGeneration::NextReadyLocked),
                             timeout);
      }
      wake_next_ = false;
      // Push mode: events are polled; a failure comes after them.
      if (ready_callback_ != nullptr && !ready_.empty()) return absl::OkStatus();
      TakeReadyLocked(out);
      if (!out->empty()) return absl::OkStatus();
      if (!failure_.ok()) return failure_;
      if (cancelled_) return absl::CancelledError("cancelled");
      if (queued_) {
        if (!granted_) return absl::OkStatus();
        queued_ = false;
        place = true;
      } else if (attempt_failure_.has_value()) {
        failure = *std::move(attempt_failure_);
        attempt_failure_.reset();
      } else {
        return absl::OkStatus();
      }
    }
    if (place) return PlaceFromQueue();
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

  bool SetReadyCallback(std::function<void()> ready) override {
    absl::MutexLock lock(&mu_);
    ready_callback_ = std::move(ready);
    return true;
  }
  void Poll(std::vector<GenerationEvent>* out) override {
    absl::MutexLock lock(&mu_);
    TakeReadyLocked(out);
  }

  // The watch thread: fails the current attempt when a worker serving it is
  // out of service (judged by the registry), or a prefill worker has not
  // accepted the prompt within the stall timeout while another live one
  // (`live_prefill`) could take it: a slow worker that is the only choice
  // is waited for (slowness is not failure; liveness is judged apart).
  void Watch(absl::Time now, const Judgements& judgements,
             const std::vector<WorkerView>& live_prefill);

  // The calls' reactions. OnDecodeEvent: true when the session is to be
  // told (NotifyReady, with mu_ released) that events can be polled.
  bool OnDecodeEvent(DecodeCall* call, DecodeEvent event);
  // Without mu_: ready_callback_ is set once, before the first Next, so
  // before OnDecodeEvent (under mu_) can say to notify.
  void NotifyReady() ABSL_NO_THREAD_SAFETY_ANALYSIS { ready_callback_(); }
  void OnDecodeDone(DecodeCall* call, const grpc::Status& status);
  void OnPrefillEvent(PrefillCall* call, PrefillEvent event);
  void OnPrefillDone(PrefillCall* call, const grpc::Status& status);

 private:
  void HandleDecodeEventLocked(DecodeCall* call, DecodeEvent event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current decode call ended (call->done): the request's end, or a
  // failed attempt.
  void DecodeEndedLocked(DecodeCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CallsDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& c : decode_calls_) {
      if (!c->done) return false;
    }
    for (const auto& c : prefill_calls_) {
      if (!c->done) return false;
    }
    return true;
  }
  // What ends Next's wait. In push mode token events do not (they are
  // polled); the first token and the end do (wake_next_, finished_).
  bool NextReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool events = ready_callback_ == nullptr ? !ready_.empty() : wake_next_ || finished_;
    return events || !failure_.ok() || cancelled_ || attempt_failure_.has_value() ||
           (queued_ && granted_);
  }
  void TakeReadyLocked(std::vector<GenerationEvent>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!ready_.empty()) {
      out->push_back(std::move(ready_.front()));
      ready_.pop_front();
    }
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
    ready_.push_back(std::move(event));
  }
  // Places the generation when its turn in the queue came: back to the
  // queue's head when every decode worker is still full.
  absl::Status PlaceFromQueue();
  // One attempt from the tokens relayed so far: a reservation on a decode
  // worker (the next one on a refusal), then the prefill.
  absl::Status StartAttempt();
  // Waits for `call`'s reservation: OK once reserved; else why this worker
  // will not serve the request (a refusal, the worker judged out of
  // service, or no answer within the stall timeout); DEADLINE_EXCEEDED
  // when the request's deadline passed; CANCELLED.
  // Waits for `call`'s reservation. A worker that stays live but silent
  // past the stall timeout is given up (UNAVAILABLE) only while
  // `another_worker()` says another could be tried.
  grpc::Status AwaitReservation(DecodeCall* call, const std::function<bool()>& another_worker);
  // Cancels the failed attempt and starts the next one, or fails.
  absl::Status Recover(AttemptFailure failure);

  DisaggregatedOrchestrator* const orchestrator_;
  const OrchestratorOptions& options_;
  const frontend::GenerationJob job_;
  const AdmissionQueue::Ticket ticket_;
  const absl::Time start_;

  // Used by Place and Recover only (one thread at a time: Start's caller,
  // then the session's).
  int attempts_ = 0;
  std::set<std::string> avoid_decode_;
  std::set<std::string> avoid_prefill_;

  mutable absl::Mutex mu_;
  // Waiting in the admission queue; granted its turn.
  bool queued_ ABSL_GUARDED_BY(mu_) = false;
  bool granted_ ABSL_GUARDED_BY(mu_) = false;
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

  // Tokens handed to the session (ready_ included), in order.
  std::vector<int32_t> generated_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<GenerationEvent> ready_ ABSL_GUARDED_BY(mu_);
  // Push mode: set once (SetReadyCallback), then called without mu_.
  std::function<void()> ready_callback_ ABSL_GUARDED_BY(mu_);
  // Push mode: events Next must take (the first token) are queued.
  bool wake_next_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  frontend::Placement placement_ ABSL_GUARDED_BY(mu_);
};

void DecodeCall::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  if (owner_->OnDecodeEvent(this, std::move(event_))) owner_->NotifyReady();
  event_.Clear();
  StartRead(&event_);
}

void DecodeCall::OnDone(const grpc::Status& status) { owner_->OnDecodeDone(this, status); }

void PrefillCall::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  owner_->OnPrefillEvent(this, std::move(event_));
  event_.Clear();
  StartRead(&event_);
}

void PrefillCall::OnDone(const grpc::Status& status) { owner_->OnPrefillDone(this, status); }

bool DisaggregatedGeneration::OnDecodeEvent(DecodeCall* call, DecodeEvent event) {
  absl::MutexLock lock(&mu_);
  if (event.event_case() == DecodeEvent::kReserved) {
    call->reserved = true;
    call->kv_target = event.reserved().kv_target();
    return false;
  }
  if (call != current_decode_) {
    // Not yet current (kept for StartAttempt), or a failed attempt's.
    if (call != pending_decode_) return false;
    call->early.push_back(std::move(event));
    return false;
  }
  const size_t queued = ready_.size();
  HandleDecodeEventLocked(call, std::move(event));
  return ready_callback_ != nullptr && ready_.size() > queued;
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
  {
    absl::MutexLock lock(&mu_);
    call->work.Release();
  }
  // Its KV and slot are free: the admission queue may move. Asked before
  // `done` is set, since the generation (and, at shutdown, the
  // orchestrator) may be gone right after.
  orchestrator_->RequestPump();
  absl::MutexLock lock(&mu_);
  call->done = true;
  call->status = status;
  // A refusal (StartAttempt reads it), the end, or a failed attempt's call.
  if (call == current_decode_) DecodeEndedLocked(call);
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
                     .disconnected = ConnectionLost(status, call->channel()),
                     .status = std::move(why)});
}

void DisaggregatedGeneration::OnPrefillEvent(PrefillCall* call, PrefillEvent event) {
  absl::MutexLock lock(&mu_);
  switch (event.event_case()) {
    case PrefillEvent::kAccepted:
      call->accepted = true;
      return;
    case PrefillEvent::kStarted:
      return;
    case PrefillEvent::kResult:
      call->result = std::move(*event.mutable_result());
      return;
    case PrefillEvent::EVENT_NOT_SET:
      return;
  }
}

void DisaggregatedGeneration::OnPrefillDone(PrefillCall* call, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    call->work.Release();
  }
  orchestrator_->RequestPump();  // the worker's queue is shorter (see OnDecodeDone)
  {
    absl::MutexLock lock(&mu_);
    call->done = true;
    if (call == current_prefill_ && !cancelled_) {
      if (status.ok() && !call->result.has_value()) {
        FailAttemptLocked({.pool = "prefill",
                           .worker_id = call->worker.desc.id,
                           .status = absl::InternalError(absl::StrCat(
                               "prefill on ", call->worker.desc.id, " ended without a token"))});
      } else if (!status.ok()) {
        orchestrator_->metrics().CountWorkerFailure("prefill");
        PDSERVE_LOG(WARNING) << "request " << job_.request_id << ": prefill on "
                             << call->worker.desc.id << " failed: " << status.error_message();
        absl::Status why(static_cast<absl::StatusCode>(status.error_code()),
                         absl::StrCat("prefill failed: ", status.error_message()));
        if (!Retryable(status.error_code())) {
          FailLocked(std::move(why));
        } else {
          FailAttemptLocked({.pool = "prefill",
                             .worker_id = call->worker.desc.id,
                             .disconnected = ConnectionLost(status, *call->channel.channel),
                             .status = std::move(why)});
        }
      } else {
        const internal::v1::PrefillResult& result = *call->result;
        GenerationEvent first;
        first.tokens.push_back(result.first_token_id());
        if (job_.sampling.logprobs >= 0) {
          first.logprobs.push_back(
              LogprobsFromProto(result.first_token_id(), result.first_token_logprobs()));
        }
        if (generated_.empty()) {
          first.queue_seconds =
              absl::ToDoubleSeconds(call->dispatch - start_) + result.queue_seconds();
        }
        RelayLocked(std::move(first));
        while (!held_.empty()) {
          RelayLocked(std::move(held_.front()));
          held_.pop_front();
        }
        attempt_first_out_ = true;
        wake_next_ = true;  // push mode: Next takes the first token
      }
    }
  }
}

void DisaggregatedGeneration::Watch(absl::Time now, const Judgements& judgements,
                                    const std::vector<WorkerView>& live_prefill) {
  absl::MutexLock lock(&mu_);
  if (queued_ || cancelled_ || finished_ || !failure_.ok() || attempt_failure_.has_value()) return;
  auto judge = [&](const std::string& id, uint64_t incarnation) -> Judgement {
    auto it = judgements.find(id);
    if (it == judgements.end() || it->second.incarnation != incarnation) {
      return {WorkerHealth::kGone,
              absl::StrCat("worker ", id, " left the pool (heartbeats stopped, or it restarted)")};
    }
    return it->second.judgement;
  };
  auto fail = [&](std::string_view pool, const std::string& id, const Judgement& j) {
    PDSERVE_LOG(WARNING) << "request " << job_.request_id << ": " << j.why << "; moving on";
    FailAttemptLocked({.pool = std::string(pool),
                       .worker_id = id,
                       .stalled = j.health == WorkerHealth::kHung,
                       .status = absl::UnavailableError(j.why)});
  };
  if (PrefillCall* p = current_prefill_; p != nullptr && !p->done && !attempt_first_out_) {
    const Judgement j = judge(p->worker.desc.id, p->worker.incarnation);
    if (j.health != WorkerHealth::kLive) return fail("prefill", p->worker.desc.id, j);
    if (!p->accepted && options_.stall_timeout > absl::ZeroDuration() &&
        now - p->dispatch > options_.stall_timeout) {
      const DecodeCall* d = current_decode_;
      const bool another =
          std::any_of(live_prefill.begin(), live_prefill.end(), [&](const WorkerView& w) {
            return w.desc.id != p->worker.desc.id && avoid_prefill_.count(w.desc.id) == 0 &&
                   (d == nullptr || KvCompatible(w.desc, d->worker()));
          });
      if (another) {
        PDSERVE_LOG(WARNING) << "request " << job_.request_id << ": prefill worker "
                             << p->worker.desc.id << " did not accept the prompt within "
                             << absl::FormatDuration(options_.stall_timeout) << "; trying another";
        FailAttemptLocked(
            {.pool = "prefill",
             .worker_id = p->worker.desc.id,
             .slow = true,
             .status = absl::UnavailableError(absl::StrCat(
                 "prefill worker ", p->worker.desc.id, " did not accept the prompt within ",
                 absl::FormatDuration(options_.stall_timeout)))});
        return;
      }
    }
  }
  if (DecodeCall* d = current_decode_; d != nullptr && !d->done && !d->finished) {
    const Judgement j = judge(d->worker().id, d->incarnation());
    if (j.health != WorkerHealth::kLive) return fail("decode", d->worker().id, j);
  }
}

absl::Status DisaggregatedGeneration::Recover(AttemptFailure failure) {
  // Outside mu_: gRPC may run reactions from TryCancel.
  if (failure.decode != nullptr) failure.decode->Cancel();
  if (failure.prefill != nullptr) failure.prefill->context.TryCancel();
  (failure.pool == "decode" ? avoid_decode_ : avoid_prefill_).insert(failure.worker_id);
  if (failure.disconnected) orchestrator_->registry().ReportDisconnected(failure.worker_id);
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
  // A prefill worker whose queue filled before its reports said so: the
  // request has not started anywhere; it waits for room again.
  if (failure.slow && generated == 0) --attempts_;  // see AttemptFailure::slow
  if (failure.status.code() == absl::StatusCode::kResourceExhausted && generated == 0) {
    --attempts_;
    SetQueued();
    if (orchestrator_->Enqueue(this, /*front=*/true)) return absl::OkStatus();
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
    if (frontend::RejectReason(status) == kNoRoomReason && generated == 0) {
      --attempts_;
      SetQueued();
      if (orchestrator_->Enqueue(this, /*front=*/true)) return absl::OkStatus();
    }
  }
  if (status.ok()) return status;
  absl::MutexLock lock(&mu_);
  FailLocked(status);
  return failure_.ok() ? absl::CancelledError("cancelled") : failure_;
}

absl::Status DisaggregatedGeneration::PlaceFromQueue() {
  absl::Status status = StartAttempt();
  if (frontend::RejectReason(status) == kNoRoomReason) {
    // Every decode worker was full after all: back to the head of the
    // queue (this does not count as an attempt).
    --attempts_;
    SetQueued();
    const bool queued = orchestrator_->Enqueue(this, /*front=*/true);
    orchestrator_->GrantUsed(this, /*requeued=*/true);
    if (queued) return absl::OkStatus();
  } else {
    orchestrator_->GrantUsed(this, /*requeued=*/false);
  }
  if (status.ok()) return status;
  absl::MutexLock lock(&mu_);
  FailLocked(status);
  return failure_.ok() ? absl::CancelledError("cancelled") : failure_;
}

grpc::Status DisaggregatedGeneration::AwaitReservation(
    DecodeCall* call, const std::function<bool()>& another_worker) {
  const absl::Time asked = absl::Now();
  WorkerRegistry& registry = orchestrator_->registry();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto answered = [this, call]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return call->reserved || call->done || cancelled_;
      };
      const absl::Duration slice = std::min(
          options_.watch_interval, std::max(absl::ZeroDuration(), job_.deadline - absl::Now()));
      mu_.AwaitWithTimeout(absl::Condition(&answered), slice);
      if (cancelled_) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      if (call->reserved) return grpc::Status::OK;
      if (call->done) {
        return call->status.ok()
                   ? grpc::Status(grpc::StatusCode::INTERNAL, "decode worker sent no reservation")
                   : call->status;
      }
    }
    const absl::Time now = absl::Now();
    if (now >= job_.deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
    }
    const Judgement j = registry.Judge(call->worker().id, call->incarnation(), now);
    if (j.health != WorkerHealth::kLive) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, j.why);
    }
    if (options_.stall_timeout > absl::ZeroDuration() && now - asked > options_.stall_timeout &&
        another_worker()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("no reservation from ", call->worker().id, " within ",
                                       absl::FormatDuration(options_.stall_timeout)));
    }
  }
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
  const DecodeQuery decode_query{.prompt_tokens = static_cast<int>(known.size()),
                                 .max_tokens = job_.sampling.max_tokens - num_generated};

  // Prefill workers that could take the prompt: a decode worker is picked
  // among those whose KV one of them can send (KvCompatible).
  std::vector<WorkerView> prefill_pool = registry.Live(Role::kPrefill, absl::Now());
  Avoid(prefill_pool, avoid_prefill_);
  const absl::Duration retry_after = options_.empty_pool_retry_after;
  const bool starting = absl::Now() - orchestrator_->created_ < retry_after * 3;
  if (prefill_pool.empty() && registry.Live(Role::kDecode, absl::Now()).empty()) {
    return frontend::WithRetryAfter(
        frontend::WithRejectReason(
            absl::UnavailableError(starting ? "no live decode worker: none has registered yet (the "
                                              "router just started; workers register within a "
                                              "second)"
                                            : "no live decode worker"),
            "no_decode_worker"),
        retry_after);
  }
  if (prefill_pool.empty()) {
    return frontend::WithRetryAfter(
        frontend::WithRejectReason(
            absl::UnavailableError(starting
                                       ? "no live prefill worker: none has registered yet (the "
                                         "router just started; workers register within a "
                                         "second)"
                                       : "no live prefill worker"),
            "no_prefill_worker"),
        retry_after);
  }

  // 1. Reserve KV on a decode worker; on refusal try the next one.
  std::set<std::string> tried;
  grpc::Status last_refusal(grpc::StatusCode::UNAVAILABLE, "no live decode worker");
  bool every_refusal_full = true;
  bool incompatible = false;
  DecodeCall* accepted = nullptr;
  // Live decode workers not tried yet whose KV a live prefill worker can
  // send; `incompatible`: some were left out for that.
  auto candidates = [&](bool* incompatible) {
    std::vector<WorkerView> pool = registry.Live(Role::kDecode, absl::Now());
    std::erase_if(pool, [&](const WorkerView& w) { return tried.count(w.desc.id) > 0; });
    const size_t before = pool.size();
    std::erase_if(pool, [&](const WorkerView& d) {
      return std::none_of(prefill_pool.begin(), prefill_pool.end(),
                          [&](const WorkerView& p) { return KvCompatible(p.desc, d.desc); });
    });
    if (incompatible != nullptr) *incompatible |= pool.size() < before;
    return pool;
  };
  // A silent decode worker is given up for this request only when another
  // one is there to try; the only choice is waited for.
  auto another_worker = [&] { return !candidates(nullptr).empty(); };
  while (accepted == nullptr) {
    std::vector<WorkerView> pool = candidates(&incompatible);
    Avoid(pool, avoid_decode_);
    std::optional<size_t> pick = orchestrator_->policy()->PickDecode(pool, decode_query);
    if (!pick) break;
    if (!tried.empty()) orchestrator_->metrics().CountRetry("decode");
    const WorkerView worker = pool[*pick];
    tried.insert(worker.desc.id);
    auto owned = std::make_unique<DecodeCall>(this, worker, decode_job, job_.deadline);
    DecodeCall* call = owned.get();
    call->work = registry.StartWork(worker.desc.id, DecodeAdmissionTokens(worker, decode_query));
    {
      absl::MutexLock lock(&mu_);
      decode_calls_.push_back(std::move(owned));
      // Pending from before its first event: a worker may stream tokens
      // right behind the reservation, before this thread wakes up to accept
      // it, and those must be kept.
      pending_decode_ = call;
    }
    call->Begin(orchestrator_->DecodeStub(worker.desc.address));
    const grpc::Status answer = AwaitReservation(call, another_worker);
    if (answer.ok()) {
      accepted = call;
      break;
    }
    {
      absl::MutexLock lock(&mu_);
      pending_decode_ = nullptr;  // refused, silent or cancelled
      call->early.clear();
    }
    call->Cancel();  // no effect on a call that ended
    switch (answer.error_code()) {
      case grpc::StatusCode::CANCELLED:
        return absl::CancelledError("cancelled");
      case grpc::StatusCode::INVALID_ARGUMENT:
        return frontend::WithRejectReason(FromGrpcStatus(answer), "invalid_argument");
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return FromGrpcStatus(answer);
      default:
        break;
    }
    if (ConnectionLost(answer, call->channel())) registry.ReportDisconnected(worker.desc.id);
    every_refusal_full &= answer.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    PDSERVE_LOG(DEBUG) << "decode worker " << worker.desc.id << " refused " << job_.request_id
                       << ": " << answer.error_message();
    last_refusal = answer;
  }
  if (accepted == nullptr) {
    if (tried.empty()) {
      return frontend::WithRetryAfter(
          frontend::WithRejectReason(
              absl::UnavailableError(
                  incompatible
                      ? "no decode worker whose KV format a live prefill worker can send "
                        "(model, weight storage or KV element type differ between the pools)"
                  : starting ? "no live decode worker: none has registered yet (the router "
                               "just started; workers register within a second)"
                             : "no live decode worker"),
              "no_decode_worker"),
          retry_after);
    }
    absl::Status refused(
        static_cast<absl::StatusCode>(last_refusal.error_code()),
        absl::StrCat("every decode worker refused: ", last_refusal.error_message()));
    // Every one full: the request waits for room (admission) rather than fail.
    if (every_refusal_full) return frontend::WithRejectReason(std::move(refused), kNoRoomReason);
    return refused;
  }

  // 2. Prefill on the prefill worker the policy picks among those that can
  // send this decode worker KV (the one likely to hold the prompt's prefix,
  // unless loaded); it sends the KV to the reservation and answers with the
  // next token.
  std::erase_if(prefill_pool,
                [&](const WorkerView& p) { return !KvCompatible(p.desc, accepted->worker()); });
  const PrefillQuery prefill_query(known);
  std::optional<size_t> prefill_pick =
      orchestrator_->policy()->PickPrefill(prefill_pool, prefill_query);
  if (!prefill_pick) {
    {
      absl::MutexLock lock(&mu_);
      pending_decode_ = nullptr;
    }
    accepted->Cancel();
    return frontend::WithRetryAfter(
        frontend::WithRejectReason(absl::UnavailableError("no live prefill worker"),
                                   "no_prefill_worker"),
        retry_after);
  }
  auto owned = std::make_unique<PrefillCall>(this, prefill_pool[*prefill_pick]);
  PrefillCall* call = owned.get();
  call->job.set_request_id(job_.request_id);
  call->job.mutable_prompt_token_ids()->Assign(job_.prompt.begin(), job_.prompt.end());
  call->job.mutable_generated_token_ids()->Assign(generated.begin(), generated.end());
  *call->job.mutable_sampling() = decode_job.sampling();
  if (job_.deadline != absl::InfiniteFuture()) {
    call->context.set_deadline(absl::ToChronoTime(job_.deadline));
  }
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      pending_decode_ = nullptr;
    } else {
      *call->job.mutable_kv_target() = accepted->kv_target;
      placement_ = {.prefill_worker = call->worker.desc.id, .decode_worker = accepted->worker().id};
      call->dispatch = absl::Now();
      call->work = registry.StartPrefill(call->worker, prefill_query, call->dispatch);
      current_decode_ = accepted;
      pending_decode_ = nullptr;
      current_prefill_ = call;
      prefill_calls_.push_back(std::move(owned));
      for (DecodeEvent& event : std::exchange(accepted->early, {})) {
        HandleDecodeEventLocked(accepted, std::move(event));
      }
      if (accepted->done) DecodeEndedLocked(accepted);
    }
  }
  if (owned != nullptr) {  // cancelled before it could be dispatched
    accepted->Cancel();    // Cancel() may have run before the reservation was made
    return absl::CancelledError("cancelled");
  }
  // A Cancel from here on reaches the call (a context cancelled before its
  // call starts cancels the call as it starts).
  call->Begin(orchestrator_->PrefillStub(call->worker.desc.address));
  return absl::OkStatus();
}

// --- DisaggregatedOrchestrator ------------------------------------------------

DisaggregatedOrchestrator::DisaggregatedOrchestrator(WorkerRegistry* registry,
                                                     const RoutingPolicy* policy,
                                                     RouterMetrics* metrics,
                                                     OrchestratorOptions options)
    : options_(options),
      registry_(registry),
      policy_(policy),
      metrics_(metrics),
      queue_(options.admission) {
  watch_thread_ = std::thread([this] {
    absl::Time next_watch = absl::Now() + options_.watch_interval;
    while (true) {
      bool pump = false;
      {
        absl::MutexLock lock(&watch_mu_);
        auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(watch_mu_) { return stop_ || pump_; };
        watch_mu_.AwaitWithDeadline(absl::Condition(&woken), next_watch);
        if (stop_) return;
        pump = std::exchange(pump_, false);
      }
      if (absl::Now() >= next_watch) {
        Watch();
        next_watch = absl::Now() + options_.watch_interval;
      } else if (pump) {
        Pump();
      }
    }
  });
}

DisaggregatedOrchestrator::~DisaggregatedOrchestrator() {
  {
    absl::MutexLock lock(&watch_mu_);
    stop_ = true;
  }
  watch_thread_.join();
}

void DisaggregatedOrchestrator::Watch() {
  const absl::Time now = absl::Now();
  const Judgements judgements = registry_->JudgeAll(now);
  const std::vector<WorkerView> live_prefill = registry_->Live(Role::kPrefill, now);
  {
    absl::MutexLock lock(&gens_mu_);  // generations stay while it is held
    for (DisaggregatedGeneration* g : generations_) g->Watch(now, judgements, live_prefill);
    std::vector<std::pair<DisaggregatedGeneration*, AdmissionQueue::Why>> expired;
    {
      absl::MutexLock admission(&admission_mu_);
      for (const auto& [ticket, why] : queue_.Expire(now)) {
        auto it = queued_.find(ticket);
        if (it == queued_.end()) continue;
        expired.emplace_back(it->second, why);
        queued_.erase(it);
      }
      metrics_->admission_queue_length.Set(queue_.size());
    }
    for (const auto& [g, why] : expired) {
      g->ExpireInQueue(
          why == AdmissionQueue::Why::kDeadline
              ? absl::DeadlineExceededError("deadline exceeded while waiting for capacity")
              : Overloaded(absl::StrCat("waited ",
                                        absl::FormatDuration(options_.admission.max_wait),
                                        " for capacity")));
    }
  }
  Pump();
  // What waits in each pool, as the workers last reported it: prompts
  // queued on prefill workers, sequences held on decode workers.
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    double waiting = 0;
    for (const WorkerView& w : registry_->Live(role, now)) {
      waiting += role == Role::kPrefill ? w.load.queued_requests : w.load.running_sequences;
    }
    metrics_->pool_queued_requests.Add({{"pool", role == Role::kPrefill ? "prefill" : "decode"}})
        .Set(waiting);
  }
}

bool DisaggregatedOrchestrator::HasCapacityNow(const AdmissionQuery& query) {
  const absl::Time now = absl::Now();
  const std::vector<WorkerView> prefill = registry_->Live(Role::kPrefill, now);
  const std::vector<WorkerView> decode = registry_->Live(Role::kDecode, now);
  return HasCapacity(prefill, decode, query, options_.admission);
}

absl::Status DisaggregatedOrchestrator::Overloaded(absl::string_view why) {
  int64_t router_tokens = 0;
  {
    absl::MutexLock lock(&admission_mu_);
    router_tokens = queue_.tokens();
  }
  const std::optional<absl::Duration> wait =
      EstimateQueueWait(registry_->Live(Role::kPrefill, absl::Now()), router_tokens);
  const absl::Duration after =
      std::clamp(wait.value_or(absl::Seconds(1)), absl::Seconds(1), absl::Seconds(60));
  return frontend::WithRetryAfter(
      frontend::WithRejectReason(absl::ResourceExhaustedError(absl::StrCat(
                                     "overloaded: ", why, "; retry after ",
                                     absl::FormatDuration(absl::Ceil(after, absl::Seconds(1))))),
                                 "overloaded"),
      after);
}

absl::StatusOr<std::unique_ptr<frontend::Generation>> DisaggregatedOrchestrator::Start(
    frontend::GenerationJob job) {
  const absl::Time now = absl::Now();
  auto generation =
      std::make_unique<DisaggregatedGeneration>(this, std::move(job), next_ticket_.fetch_add(1));
  {
    absl::MutexLock lock(&gens_mu_);
    generations_.insert(generation.get());
  }
  const AdmissionQuery query = generation->query();
  // Larger than every decode worker's whole cache: no wait would help.
  if (!CouldEverFit(registry_->Live(Role::kDecode, now), query)) {
    return frontend::WithRejectReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "the request needs the KV of ", query.prompt_tokens, " prompt tokens and up to ",
            query.max_tokens, " more, more than any decode worker's cache holds")),
        "resource_exhausted");
  }
  bool wait = false;
  {
    absl::MutexLock lock(&admission_mu_);
    wait = queue_.size() > 0 || granted_ != nullptr;
  }
  if (!wait) wait = !HasCapacityNow(query);
  if (wait) {
    // Refused at once when the queue is full. (Not on an estimate of the
    // wait against the request's deadline: requests ahead leave the queue
    // when their clients go, and a rate measured over a few steps is a poor
    // guide; the deadline is honoured in the queue instead.)
    generation->SetQueued();
    if (!Enqueue(generation.get(), /*front=*/false)) {
      return Overloaded(absl::StrCat(options_.admission.max_queued, " requests already waiting"));
    }
    Pump();
    return generation;
  }
  absl::Status placed = generation->Place();
  if (frontend::RejectReason(placed) == kNoRoomReason) {
    generation->SetQueued();
    if (!Enqueue(generation.get(), /*front=*/false)) {
      return Overloaded(absl::StrCat(options_.admission.max_queued, " requests already waiting"));
    }
    Pump();
    return generation;
  }
  if (!placed.ok()) return placed;
  return generation;
}

bool DisaggregatedOrchestrator::Enqueue(DisaggregatedGeneration* generation, bool front) {
  const frontend::GenerationJob& job = generation->job();
  const AdmissionQuery query = generation->query();
  absl::MutexLock lock(&admission_mu_);
  if (!queue_.Push({.ticket = generation->ticket(),
                    .priority = job.priority,
                    .enqueued = absl::Now(),
                    .deadline = job.deadline,
                    .tokens = query.prompt_tokens},
                   front)) {
    return false;
  }
  queued_[generation->ticket()] = generation;
  metrics_->admission_queue_length.Set(queue_.size());
  return true;
}

void DisaggregatedOrchestrator::RequestPump() {
  absl::MutexLock lock(&watch_mu_);
  pump_ = true;
}

void DisaggregatedOrchestrator::GrantUsed(DisaggregatedGeneration* generation, bool requeued) {
  {
    absl::MutexLock lock(&admission_mu_);
    if (granted_ == generation) granted_ = nullptr;
  }
  if (!requeued) Pump();
}

void DisaggregatedOrchestrator::Pump() {
  absl::MutexLock lock(&admission_mu_);
  if (granted_ != nullptr) return;
  const AdmissionQueue::Waiting* head = queue_.Head();
  if (head == nullptr) return;
  auto it = queued_.find(head->ticket);
  DisaggregatedGeneration* generation = it->second;
  if (!HasCapacityNow(generation->query())) return;
  const absl::Duration waited = absl::Now() - head->enqueued;
  queue_.Remove(head->ticket);
  queued_.erase(it);
  metrics_->admission_queue_length.Set(queue_.size());
  metrics_->admission_wait_seconds.Observe(absl::ToDoubleSeconds(waited));
  granted_ = generation;
  generation->Grant();
}

void DisaggregatedOrchestrator::Forget(DisaggregatedGeneration* generation) {
  {
    absl::MutexLock lock(&gens_mu_);
    generations_.erase(generation);
  }
  bool was_granted = false;
  {
    absl::MutexLock lock(&admission_mu_);
    if (queued_.erase(generation->ticket()) > 0) queue_.Remove(generation->ticket());
    if (granted_ == generation) {
      granted_ = nullptr;
      was_granted = true;
    }
    metrics_->admission_queue_length.Set(queue_.size());
  }
  if (was_granted) Pump();
}

int DisaggregatedOrchestrator::queued() {
  absl::MutexLock lock(&admission_mu_);
  return queue_.size();
}

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
      return entry.second.stub.use_count() == 1 && live.count(entry.first) == 0;
    });
  };
  prune(prefill_stubs_);
  prune(decode_stubs_);
}

template <typename Service>
DisaggregatedOrchestrator::WorkerChannel<Service> DisaggregatedOrchestrator::CachedStub(
    StubMap<Service>& stubs, const std::string& address) {
  {
    absl::MutexLock lock(&stubs_mu_);
    auto it = stubs.find(address);
    if (it != stubs.end()) return it->second;
  }
  const std::set<std::string> live = LiveAddresses();  // outside stubs_mu_
  absl::MutexLock lock(&stubs_mu_);
  PruneStubsLocked(live);
  WorkerChannel<Service>& entry = stubs[address];
  if (!entry.stub) {
    entry.channel = MakeChannel(address);
    entry.stub = Service::NewStub(entry.channel);
  }
  return entry;
}

DisaggregatedOrchestrator::WorkerChannel<internal::v1::PrefillWorker>
DisaggregatedOrchestrator::PrefillStub(const std::string& address) {
  return CachedStub<internal::v1::PrefillWorker>(prefill_stubs_, address);
}

DisaggregatedOrchestrator::WorkerChannel<internal::v1::DecodeWorker>
DisaggregatedOrchestrator::DecodeStub(const std::string& address) {
  return CachedStub<internal::v1::DecodeWorker>(decode_stubs_, address);
}

int DisaggregatedOrchestrator::channel_count() {
  absl::MutexLock lock(&stubs_mu_);
  return static_cast<int>(prefill_stubs_.size() + decode_stubs_.size());
}

}  // namespace pdserve::router
