// The request session: one client request's whole life in the front end,
// whatever protocol it came by. SessionManager::Start refuses while
// draining, applies admission control (--max_in_flight), validates and
// builds the prompt (frontend/request_validation.h) and starts the
// generation on the orchestration (frontend/orchestrator.h);
// RequestSession::Next then turns the generation's token events into deltas
// for the client (frontend/stream_assembler.h: detokenizer, stop strings,
// history), enforces the deadline, measures timings and records the client
// metrics. Protocol adapters (gRPC, OpenAI HTTP) only translate requests in
// and deltas out, and say when the client went away.
//
// Every request that reaches Start is counted exactly once in
// pdserve_requests_total: "rejected" (with pdserve_requests_rejected_total
// {reason}) when Start refuses it, else by how its session ended: length,
// stop, context, cancelled (the client went away), deadline, or error (the
// generation failed).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/types/finish_reason.h"
#include "frontend/client_metrics.h"
#include "frontend/orchestrator.h"
#include "frontend/prompt_source.h"
#include "frontend/request.h"
#include "frontend/request_validation.h"
#include "frontend/stream_assembler.h"

namespace pdserve::frontend {

struct SessionOptions {
  int max_in_flight = 1024;  // sessions at once; beyond: RESOURCE_EXHAUSTED
  ValidationOptions validation;
  // What refusals call this process: "router is draining".
  std::string server_kind = "router";
};

// Per-request timings, in seconds; set on the last delta.
struct Timings {
  double queue_seconds = 0;  // arrival to prefill start
  double time_to_first_token_seconds = 0;
  double mean_inter_token_seconds = 0;
  double e2e_seconds = 0;
  std::string prefill_worker;
  std::string decode_worker;
};

// What the client gets next.
struct Delta {
  std::vector<int32_t> token_ids;
  // One per token id when the request asked for logprobs.
  std::vector<engine::SampledToken> logprobs;
  std::string text;  // whole UTF-8 characters
  // The last delta of a request: it carries no tokens, only the text held
  // back until the end, and the fields below.
  bool finished = false;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;  // kStop for a stop string
  std::string matched_stop;  // the stop string that ended it, if one did
  int prompt_tokens = 0;
  int completion_tokens = 0;
  Timings timings;
};

// What the adapter knows of the call.
struct CallInfo {
  absl::Time arrival = absl::Now();
  absl::Time deadline = absl::InfiniteFuture();
};

class SessionManager;

// What a session hands its deltas to (see RequestSession::Run).
struct SessionOutput {
  // Takes the next delta, in order; false: the client went away. Called with
  // the session's lock held (so deltas made on different threads keep their
  // order): it must not call back into the session.
  std::function<bool(const Delta&)> send;
  // Optional: called after `send`, once the lock is released (e.g. to start
  // the write that `send` queued).
  std::function<void()> flush;
};

// Thread-safe: Run (or Next) on one thread, Pump and Interrupt from any.
class RequestSession {
 public:
  RequestSession(const RequestSession&) = delete;
  RequestSession& operator=(const RequestSession&) = delete;
  // Ends the request if it has not ended (as if the client went away).
  ~RequestSession();

  // Waits up to `timeout` (InfiniteDuration: no limit) for the generation to
  // move on; the wait ends at the request's deadline in any case, and at once
  // on Interrupt. Returns the next delta, nullopt when nothing happened in
  // time, or an error when the request ended without finishing:
  // DEADLINE_EXCEEDED when the deadline passed (the generation is
  // cancelled), CANCELLED after Interrupt (as Abandon), else the
  // generation's error. Not called again after a delta with `finished` or
  // an error.
  absl::StatusOr<std::optional<Delta>> Next(absl::Duration timeout);

  // Drives the request to its end on the calling thread: each delta goes to
  // `output`, and `client_gone` is asked whenever nothing arrived for `poll`
  // (a write to a client that left fails anyway). The thread sleeps between
  // tokens: it wakes for a token (unless Pump took it), the end, the
  // deadline, Interrupt, or `poll` passing. Returns OK once the last delta
  // was sent, else how the request ended (CANCELLED, DEADLINE_EXCEEDED, or
  // the generation's error).
  absl::Status Run(const SessionOutput& output, const std::function<bool()>& client_gone,
                   absl::Duration poll);

  // Push mode, before Run: asks the generation to call `ready` when token
  // events arrive (Generation::SetReadyCallback), on the thread that
  // received them; `ready` then calls Pump. False when the generation has no
  // push mode (Run's thread takes every event).
  bool EnablePush(std::function<void()> ready);
  // Push mode, any thread while Run runs: turns the token events that
  // arrived into a delta for `output` at once, without waking Run's thread.
  // Never waits and never ends the request (Run's thread is woken for the
  // end); a delta `output` refuses interrupts the request.
  void Pump(const SessionOutput& output);

  // The client went away (a write failed, or the adapter saw it leave):
  // cancels the generation and ends the request as cancelled, or as
  // deadline when its deadline has passed. Returns the matching status.
  absl::Status Abandon();

  // Any thread: the client went away, as the adapter's transport reported it
  // (gRPC's OnCancel). Cancels the generation, which wakes a Next that is
  // waiting; the request then ends as Abandon ends it. Does nothing once the
  // request has ended.
  void Interrupt();

  const ValidatedRequest& request() const { return request_; }
  bool ended() const;

 private:
  friend class SessionManager;
  RequestSession(SessionManager* manager, ValidatedRequest request, CallInfo call,
                 absl::Time started, std::unique_ptr<Generation> generation);

  // Next with mu_ held; releases it while waiting for the generation.
  absl::StatusOr<std::optional<Delta>> NextLocked(absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pump with mu_ held; true when it sent a delta.
  bool PumpLocked(const SessionOutput& output) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the events in events_ into one delta (nullopt: no token among
  // them); the last delta instead when `finish` and the end is known and no
  // token came.
  std::optional<Delta> TakeDeltaLocked(bool finish) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes one generation event into `delta`; observes the token metrics.
  void Take(GenerationEvent& event, Delta* delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The last delta (text held back, usage, timings); ends the request.
  Delta FinishLocked(engine::FinishReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AbandonLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the request once: counts it as `label` (or, with a
  // `reject_reason`, as a refusal for that reason), releases admission, and
  // moves the generation to retired_ (destroyed once mu_ is released: its
  // destructor waits for the worker calls, whose reactions may Pump).
  void EndLocked(const std::string& label, const std::string& reject_reason = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PastDeadline(absl::Time now) const;

  SessionManager* const manager_;
  const ValidatedRequest request_;
  const CallInfo call_;
  const absl::Time started_;  // when the orchestration was asked
  const bool want_logprobs_;

  mutable absl::Mutex mu_;  // before generation_mu_
  // Changed only with both mu_ and generation_mu_ held (EndLocked); read
  // with either. Alive while mu_ is released for a wait: only the thread
  // that waits ends the request.
  absl::Mutex generation_mu_;
  std::unique_ptr<Generation> generation_;
  std::unique_ptr<Generation> retired_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> interrupted_{false};
  bool push_ ABSL_GUARDED_BY(mu_) = false;
  StreamAssembler assembler_ ABSL_GUARDED_BY(mu_);
  // Taken from the generation, not yet delivered.
  std::vector<GenerationEvent> events_ ABSL_GUARDED_BY(mu_);
  size_t next_event_ ABSL_GUARDED_BY(mu_) = 0;
  // Set once the end is known (the workers finished, or a stop string
  // matched); the next Next returns the last delta.
  std::optional<engine::FinishReason> pending_finish_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  int completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  bool queue_observed_ ABSL_GUARDED_BY(mu_) = false;
  double queue_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_token_time_ ABSL_GUARDED_BY(mu_);
  absl::Time last_token_time_ ABSL_GUARDED_BY(mu_);
  std::string matched_stop_ ABSL_GUARDED_BY(mu_);
};

class SessionManager {
 public:
  // Every pointer must outlive the manager and all its sessions.
  SessionManager(SessionOptions options, const PromptSource* prompt_source,
                 Orchestrator* orchestrator, ClientMetrics* metrics);

  // Starts a request. A refusal (draining: UNAVAILABLE; admission:
  // RESOURCE_EXHAUSTED; bad input: INVALID_ARGUMENT naming the field; the
  // orchestration's refusals) is counted and returned.
  absl::StatusOr<std::unique_ptr<RequestSession>> Start(const Request& request,
                                                        const CallInfo& call);

  // While draining, Start refuses with UNAVAILABLE; sessions go on.
  void SetDraining(bool draining) { draining_.store(draining); }
  bool draining() const { return draining_.load(); }
  // Sessions admitted and not yet ended.
  int in_flight() const { return in_flight_.load(); }
  const PromptSource& prompt_source() const { return *prompt_source_; }
  const SessionOptions& options() const { return options_; }

  // Counts a refusal the adapter made itself (a request it could not decode)
  // and returns `status`.
  absl::Status Refuse(absl::Status status, const std::string& reason);
  // Counts a call whose client went away before its request could be read
  // (as deadline when `call`'s deadline has passed, else cancelled) and
  // returns the matching status.
  absl::Status AbandonedBeforeStart(const CallInfo& call);

 private:
  friend class RequestSession;

  const SessionOptions options_;
  const PromptSource* const prompt_source_;
  Orchestrator* const orchestrator_;
  ClientMetrics* const metrics_;
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> seed_counter_;
};

// RequestSession::Run with `send` as the output. An adapter whose transport
// reports a departed client calls RequestSession::Interrupt and passes
// InfiniteDuration as `poll` (no wake-ups while a stream is idle); one that
// can only look at its connection passes a long poll.
absl::Status RunSession(RequestSession& session, const std::function<bool(const Delta&)>& send,
                        const std::function<bool()>& client_gone, absl::Duration poll);

// "length", "stop" or "context" (the finish_reason label).
std::string FinishLabel(engine::FinishReason reason);

}  // namespace pdserve::frontend
