#include "frontend/request_session.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "frontend/errors.h"

namespace pdserve::frontend {
namespace {

// A client that goes away, or a request that fails, this close to its
// deadline is counted as having hit the deadline: gRPC cancels a call at its
// deadline on its own clock.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(10);

}  // namespace

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

// --- RequestSession ----------------------------------------------------------

RequestSession::RequestSession(SessionManager* manager, ValidatedRequest request, CallInfo call,
                               absl::Time started, std::unique_ptr<Generation> generation)
    : manager_(manager),
      request_(std::move(request)),
      call_(call),
      started_(started),
      want_logprobs_(request_.sampling.logprobs >= 0),
      generation_(std::move(generation)),
      assembler_(*manager->prompt_source().tokenizer, request_.stop_strings) {}

RequestSession::~RequestSession() {
  if (!ended()) Abandon().IgnoreError();  // a destructor has no one to tell
}

bool RequestSession::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

bool RequestSession::PastDeadline(absl::Time now) const { return now >= call_.deadline; }

absl::StatusOr<std::optional<Delta>> RequestSession::Next(absl::Duration timeout) {
  std::unique_ptr<Generation> retired;
  absl::StatusOr<std::optional<Delta>> next;
  {
    absl::MutexLock lock(&mu_);
    next = NextLocked(timeout);
    retired = std::move(retired_);
  }
  return next;  // `retired` goes first, outside mu_
}

absl::StatusOr<std::optional<Delta>> RequestSession::NextLocked(absl::Duration timeout) {
  if (ended_) return absl::FailedPreconditionError("the request has ended");
  if (interrupted_.load()) return AbandonLocked();
  if (pending_finish_.has_value()) return FinishLocked(*pending_finish_);
  const absl::Time now = absl::Now();
  if (PastDeadline(now)) {
    generation_->Cancel();
    EndLocked("deadline");
    return absl::DeadlineExceededError("deadline exceeded");
  }
  if (next_event_ == events_.size()) {
    events_.clear();
    next_event_ = 0;
    if (push_) generation_->Poll(&events_);
  }
  if (next_event_ == events_.size()) {
    const absl::Duration wait =
        std::max(absl::ZeroDuration(), std::min(timeout, call_.deadline - now));
    // Pump may deliver tokens meanwhile; the generation stays (only this
    // thread ends the request).
    Generation* const generation = generation_.get();
    std::vector<GenerationEvent> arrived;
    mu_.Unlock();
    absl::Status status = generation->Next(wait, &arrived);
    mu_.Lock();
    if (arrived.empty() && interrupted_.load()) return AbandonLocked();
    if (pending_finish_.has_value()) return FinishLocked(*pending_finish_);  // seen by Pump
    if (!status.ok()) {
      // A failure this close to the deadline is the deadline's: gRPC ends
      // the workers' calls at it on its own clock, which may run a little
      // ahead of this one (then a retry finds no room, say, and its refusal
      // comes back just before the deadline here).
      if (PastDeadline(absl::Now() + kDeadlineSlack)) {
        EndLocked("deadline");
        return absl::DeadlineExceededError("deadline exceeded");
      }
      // Refused before any token (it waited in the router's queue, then
      // the wait ran out): a refusal, not a failure.
      if (const std::string reason = RejectReason(status);
          !reason.empty() && completion_tokens_ == 0) {
        EndLocked("rejected", reason);
        return status;
      }
      PDSERVE_LOG(WARNING) << "request " << request_.request_id << " failed: " << status;
      EndLocked("error");
      return status;
    }
    if (next_event_ == events_.size()) {
      events_.clear();
      next_event_ = 0;
    }
    for (GenerationEvent& event : arrived) events_.push_back(std::move(event));
    if (push_ && next_event_ == events_.size()) generation_->Poll(&events_);
    if (next_event_ == events_.size()) return std::nullopt;
  }
  return TakeDeltaLocked(/*finish=*/true);
}

std::optional<Delta> RequestSession::TakeDeltaLocked(bool finish) {
  // Everything that arrived goes out as one delta, up to the end.
  Delta delta;
  while (next_event_ < events_.size() && !pending_finish_.has_value()) {
    GenerationEvent& event = events_[next_event_++];
    Take(event, &delta);
    if (assembler_.stopped()) {
      generation_->Cancel();  // a stop string: the workers free the request
      pending_finish_ = engine::FinishReason::kStop;
    } else if (event.finished) {
      pending_finish_ = event.finish_reason;
    }
  }
  if (delta.token_ids.empty()) {
    if (finish && pending_finish_.has_value()) return FinishLocked(*pending_finish_);
    return std::nullopt;
  }
  const absl::Time sent = absl::Now();
  ClientMetrics& metrics = *manager_->metrics_;
  const int n = static_cast<int>(delta.token_ids.size());
  if (completion_tokens_ == 0) {
    first_token_time_ = sent;
    metrics.time_to_first_token.Observe(absl::ToDoubleSeconds(sent - call_.arrival));
  } else {
    metrics.inter_token_latency.Observe(absl::ToDoubleSeconds(sent - last_token_time_));
  }
  // Tokens that arrive together share one gap.
  for (int i = 1; i < n; ++i) metrics.inter_token_latency.Observe(0);
  last_token_time_ = sent;
  completion_tokens_ += n;
  metrics.generation_tokens.Increment(n);
  return delta;
}

void RequestSession::Take(GenerationEvent& event, Delta* delta) {
  if (event.queue_seconds.has_value() && !queue_observed_) {
    queue_observed_ = true;
    queue_seconds_ = absl::ToDoubleSeconds(started_ - call_.arrival) + *event.queue_seconds;
    manager_->metrics_->queue_time.Observe(queue_seconds_);
  }
  StreamAssembler::Piece piece = assembler_.Push(event.tokens);
  delta->token_ids.insert(delta->token_ids.end(), event.tokens.begin(),
                          event.tokens.begin() + piece.num_tokens);
  if (want_logprobs_) {
    for (size_t i = 0; i < piece.num_tokens && i < event.logprobs.size(); ++i) {
      delta->logprobs.push_back(std::move(event.logprobs[i]));
    }
  }
  delta->text += piece.text;
  if (piece.stopped) matched_stop_ = std::move(piece.matched_stop);
}

Delta RequestSession::FinishLocked(engine::FinishReason reason) {
  const absl::Time end = absl::Now();
  Delta last;
  StreamAssembler::Piece piece = assembler_.Flush();
  last.text = std::move(piece.text);
  if (piece.stopped) matched_stop_ = std::move(piece.matched_stop);
  if (!matched_stop_.empty()) reason = engine::FinishReason::kStop;
  last.finished = true;
  last.finish_reason = reason;
  last.matched_stop = matched_stop_;
  last.prompt_tokens = static_cast<int>(request_.prompt.size());
  last.completion_tokens = completion_tokens_;
  Timings& t = last.timings;
  t.queue_seconds = queue_seconds_;
  if (completion_tokens_ > 0) {
    t.time_to_first_token_seconds = absl::ToDoubleSeconds(first_token_time_ - call_.arrival);
  }
  t.mean_inter_token_seconds =
      completion_tokens_ > 1
          ? absl::ToDoubleSeconds(last_token_time_ - first_token_time_) / (completion_tokens_ - 1)
          : 0.0;
  t.e2e_seconds = absl::ToDoubleSeconds(end - call_.arrival);
  const Placement placement = generation_->placement();
  t.prefill_worker = placement.prefill_worker;
  t.decode_worker = placement.decode_worker;
  manager_->metrics_->e2e_latency.Observe(t.e2e_seconds);
  if (completion_tokens_ > 1) {
    manager_->metrics_->time_per_output_token.Observe(t.mean_inter_token_seconds);
  }
  EndLocked(FinishLabel(reason));
  return last;
}

absl::Status RequestSession::Abandon() {
  std::unique_ptr<Generation> retired;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = AbandonLocked();
    retired = std::move(retired_);
  }
  return status;
}

absl::Status RequestSession::AbandonLocked() {
  const bool deadline = PastDeadline(absl::Now() + kDeadlineSlack);
  if (!ended_) {
    generation_->Cancel();
    EndLocked(deadline ? "deadline" : "cancelled");
  }
  return deadline ? absl::DeadlineExceededError("deadline exceeded")
                  : absl::CancelledError("cancelled by the client");
}

void RequestSession::Interrupt() {
  interrupted_.store(true);
  absl::MutexLock lock(&generation_mu_);
  if (generation_ != nullptr) generation_->Cancel();
}

bool RequestSession::EnablePush(std::function<void()> ready) {
  absl::MutexLock lock(&mu_);
  if (ended_ || push_) return push_;
  push_ = generation_->SetReadyCallback(std::move(ready));
  return push_;
}

void RequestSession::Pump(const SessionOutput& output) {
  // Busy: its holder takes the events (Run's thread polls before it waits,
  // and a push-mode generation does not let it wait while events are
  // queued). This also keeps a reaction that gRPC runs inline from a Cancel
  // made under mu_ from locking it again.
  if (!mu_.TryLock()) return;
  const bool sent = PumpLocked(output);
  mu_.Unlock();
  if (sent && output.flush) output.flush();
}

bool RequestSession::PumpLocked(const SessionOutput& output) {
  if (!push_ || ended_ || interrupted_.load() || pending_finish_.has_value()) return false;
  if (next_event_ == events_.size()) {
    events_.clear();
    next_event_ = 0;
    generation_->Poll(&events_);
  }
  // The end (if it came) is left to Run's thread, which the generation wakes
  // for it.
  std::optional<Delta> delta = TakeDeltaLocked(/*finish=*/false);
  if (!delta.has_value()) return false;
  if (!output.send(*delta)) {
    interrupted_.store(true);
    generation_->Cancel();  // wakes Run's thread, which ends the request
  }
  return true;
}

absl::Status RequestSession::Run(const SessionOutput& output,
                                 const std::function<bool()>& client_gone, absl::Duration poll) {
  if (client_gone()) return Abandon();
  while (true) {
    std::unique_ptr<Generation> retired;
    std::optional<absl::Status> result;
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<std::optional<Delta>> next = NextLocked(poll);
      if (!next.ok()) {
        result = next.status();
      } else if (!next->has_value()) {
        idle = true;
      } else if (!output.send(**next)) {
        result = AbandonLocked();
      } else if ((*next)->finished) {
        result = absl::OkStatus();
      }
      retired = std::move(retired_);
    }
    retired.reset();
    if (output.flush) output.flush();
    if (result.has_value()) return *result;
    if (idle && client_gone()) return Abandon();
  }
}

void RequestSession::EndLocked(const std::string& label, const std::string& reject_reason) {
  if (ended_) return;
  ended_ = true;
  // Frees the workers' share now rather than when the adapter lets go.
  {
    absl::MutexLock lock(&generation_mu_);
    retired_ = std::move(generation_);
  }
  ClientMetrics& metrics = *manager_->metrics_;
  if (reject_reason.empty()) {
    metrics.CountFinished(label);
  } else {
    metrics.CountRejected(reject_reason);
  }
  metrics.in_flight.Decrement();
  manager_->in_flight_.fetch_sub(1);
}

// --- SessionManager ----------------------------------------------------------

SessionManager::SessionManager(SessionOptions options, const PromptSource* prompt_source,
                               Orchestrator* orchestrator, ClientMetrics* metrics)
    : options_(std::move(options)),
      prompt_source_(prompt_source),
      orchestrator_(orchestrator),
      metrics_(metrics),
      seed_counter_(std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)) {}

absl::Status SessionManager::Refuse(absl::Status status, const std::string& reason) {
  metrics_->CountRejected(reason);
  return status;
}

absl::Status SessionManager::AbandonedBeforeStart(const CallInfo& call) {
  if (absl::Now() + kDeadlineSlack >= call.deadline) {
    metrics_->CountFinished("deadline");
    return absl::DeadlineExceededError("deadline exceeded");
  }
  metrics_->CountFinished("cancelled");
  return absl::CancelledError("cancelled by the client");
}

absl::StatusOr<std::unique_ptr<RequestSession>> SessionManager::Start(const Request& request,
                                                                      const CallInfo& call) {
  if (draining_.load()) {
    return Refuse(absl::UnavailableError(absl::StrCat(options_.server_kind, " is draining")),
                  "draining");
  }
  if (in_flight_.fetch_add(1) >= options_.max_in_flight) {
    in_flight_.fetch_sub(1);
    return Refuse(
        absl::ResourceExhaustedError(absl::StrCat(
            options_.server_kind, " at capacity: ", options_.max_in_flight, " requests in flight")),
        "capacity");
  }
  metrics_->in_flight.Increment();
  auto release = [this] {
    metrics_->in_flight.Decrement();
    in_flight_.fetch_sub(1);
  };

  absl::StatusOr<ValidatedRequest> validated =
      ValidateRequest(request, *prompt_source_, options_.validation, call.arrival,
                      seed_counter_.fetch_add(0x9E3779B97F4A7C15ull));
  if (!validated.ok()) {
    release();
    return Refuse(validated.status(), "invalid_argument");
  }
  GenerationJob job{.request_id = validated->request_id,
                    .prompt = validated->prompt,
                    .sampling = validated->sampling,
                    .deadline = call.deadline,
                    .priority = validated->priority};
  const absl::Time started = absl::Now();
  absl::StatusOr<std::unique_ptr<Generation>> generation = orchestrator_->Start(std::move(job));
  if (!generation.ok()) {
    release();
    if (generation.status().code() == absl::StatusCode::kDeadlineExceeded ||
        absl::Now() + kDeadlineSlack >= call.deadline) {
      metrics_->CountFinished("deadline");
      return absl::DeadlineExceededError("deadline exceeded");
    }
    std::string reason = RejectReason(generation.status());
    if (reason.empty()) reason = RejectReasonForCode(generation.status().code());
    return Refuse(generation.status(), reason);
  }
  metrics_->prompt_tokens.Increment(static_cast<double>(validated->prompt.size()));
  metrics_->requested_tokens.Increment(static_cast<double>(validated->sampling.max_tokens));
  return std::unique_ptr<RequestSession>(
      new RequestSession(this, *std::move(validated), call, started, *std::move(generation)));
}

// --- RunSession --------------------------------------------------------------

absl::Status RunSession(RequestSession& session, const std::function<bool(const Delta&)>& send,
                        const std::function<bool()>& client_gone, absl::Duration poll) {
  return session.Run({.send = send}, client_gone, poll);
}

}  // namespace pdserve::frontend
