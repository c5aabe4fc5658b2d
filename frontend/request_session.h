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

class RequestSession {
 public:
  RequestSession(const RequestSession&) = delete;
  RequestSession& operator=(const RequestSession&) = delete;
  // Ends the request if it has not ended (as if the client went away).
  ~RequestSession();

  // Waits up to `timeout` for the generation to move on. Returns the next
  // delta, nullopt when nothing happened in time, or an error when the
  // request ended without finishing: DEADLINE_EXCEEDED when the deadline
  // passed (the generation is cancelled), else the generation's error. Not
  // called again after a delta with `finished` or an error.
  absl::StatusOr<std::optional<Delta>> Next(absl::Duration timeout);

  // The client went away (a write failed, or the adapter saw it leave):
  // cancels the generation and ends the request as cancelled, or as
  // deadline when its deadline has passed. Returns the matching status.
  absl::Status Abandon();

  const ValidatedRequest& request() const { return request_; }
  bool ended() const { return ended_; }

 private:
  friend class SessionManager;
  RequestSession(SessionManager* manager, ValidatedRequest request, CallInfo call,
                 absl::Time started, std::unique_ptr<Generation> generation);

  // Takes one generation event into `delta`; observes the token metrics.
  void Take(GenerationEvent& event, Delta* delta);
  // The last delta (text held back, usage, timings); ends the request.
  Delta Finish(engine::FinishReason reason);
  // Ends the request once: counts it as `label` (or, with a
  // `reject_reason`, as a refusal for that reason), releases admission.
  void End(const std::string& label, const std::string& reject_reason = "");
  bool PastDeadline(absl::Time now) const;

  SessionManager* const manager_;
  const ValidatedRequest request_;
  const CallInfo call_;
  const absl::Time started_;  // when the orchestration was asked
  StreamAssembler assembler_;
  std::unique_ptr<Generation> generation_;
  std::vector<GenerationEvent> events_;  // taken from the generation, not yet delivered
  size_t next_event_ = 0;
  // Set once the end is known (the workers finished, or a stop string
  // matched); the next Next returns the last delta.
  std::optional<engine::FinishReason> pending_finish_;
  const bool want_logprobs_;
  bool ended_ = false;
  int completion_tokens_ = 0;
  bool queue_observed_ = false;
  double queue_seconds_ = 0;
  absl::Time first_token_time_;
  absl::Time last_token_time_;
  std::string matched_stop_;
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

// Drives `session` to its end: each delta goes to `send` (false: the client
// went away), and `client_gone` is asked whenever nothing arrived for
// `poll` (a write to a client that left fails anyway). Returns OK once the last delta was sent,
// else how the request ended (CANCELLED, DEADLINE_EXCEEDED, or the generation's error).
absl::Status RunSession(RequestSession& session, const std::function<bool(const Delta&)>& send,
                        const std::function<bool()>& client_gone,
                        absl::Duration poll = absl::Milliseconds(20));

// "length", "stop" or "context" (the finish_reason label).
std::string FinishLabel(engine::FinishReason reason);

}  // namespace pdserve::frontend
