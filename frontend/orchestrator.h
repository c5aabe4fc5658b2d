// The interface between a request session (frontend/request_session.h) and
// whatever runs the generation: picking workers and talking to them. The
// router implements it over the internal gRPC worker services
// (router/disaggregated_orchestrator.h); the colocated baseline over its
// in-process engine (colocated/colocated_orchestrator.h); tests with a
// scripted fake. The session sees only validated jobs going in and token
// events coming out, so what happens between (retries on another worker,
// re-prefilling prompt + generated tokens elsewhere after a worker dies)
// stays inside an implementation of this interface.
#pragma once

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
#include "engine/types/sampling_params.h"

namespace pdserve::frontend {

// A validated, tokenized request.
struct GenerationJob {
  std::string request_id;
  std::vector<int32_t> prompt;      // non-empty, ids in the vocabulary
  engine::SamplingParams sampling;  // validated, seed resolved
  // Work on the request's behalf ends by then (worker call deadlines).
  absl::Time deadline = absl::InfiniteFuture();
  // Admission order while requests wait for capacity: lower first.
  int priority = 0;
};

// What a generation produced since the previous event.
struct GenerationEvent {
  // Generated tokens in order; the first event's first token is the first
  // generated token.
  std::vector<int32_t> tokens;
  // One per token when the job asked for logprobs (sampling.logprobs >= 0).
  std::vector<engine::SampledToken> logprobs;
  // The last event: the workers finished the sequence (and freed it).
  bool finished = false;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  // With the event carrying the first token: seconds from Start to the start
  // of prefill compute (orchestration and worker queues).
  std::optional<double> queue_seconds;
};

// Which workers served a generation (the response's timings).
struct Placement {
  std::string prefill_worker;
  std::string decode_worker;
};

// One request running on the workers. Next is called from one thread (the
// session's); Cancel from any thread.
//
// Waiting is event-driven: a Next that waits is woken by what it waits for
// (events arriving, the generation failing, Cancel), never by a poll, and the
// session calls it with long timeouts (up to the request's deadline, or
// InfiniteDuration), so an open stream costs no CPU while nothing happens.
// An implementation that must act on time passing (e.g. declaring a silent
// worker stalled) bounds its own wait by when it must act, and may then return
// OK with nothing appended.
class Generation {
 public:
  // Cancels the generation if it has not finished; returns once nothing
  // refers to the object any more. Worker resources are released, or their
  // release is under way.
  virtual ~Generation() = default;

  // Appends the events that arrived to `out`, waiting up to `timeout` while
  // there are none. OK with nothing appended: the timeout (or the
  // implementation's own timer, see above) passed. An error
  // status: the generation failed (what it produced before was returned by
  // earlier calls); its message is for the client. Not called again after
  // an event with `finished` or an error.
  virtual absl::Status Next(absl::Duration timeout, std::vector<GenerationEvent>* out) = 0;

  // Stops the generation and frees what it holds on the workers.
  // Idempotent; a Next after it returns CANCELLED (or events already queued),
  // and a Next waiting when it is called returns at once.
  virtual void Cancel() = 0;

  // The workers serving it now (may change if the orchestration moves it).
  virtual Placement placement() const = 0;

  // Push mode (optional): events are taken with Poll, as they arrive, by
  // whoever `ready` wakes, instead of by the thread waiting in Next (which
  // saves waking that thread for every token). False: not supported, nothing
  // changes. After it returned true, `ready` is called after events were
  // queued that Poll can take (at least after each batch of tokens; events
  // that need Next anyway, such as the end, may wake Next instead), on the
  // thread that queued them, with no lock of the generation held, never
  // from within SetReadyCallback or Poll. Next then appends nothing: it
  // returns at once (OK) while events are queued, and otherwise waits for
  // what only Next handles (the end, a failure, cancellation, a retry, its
  // timers). Called once, before the first Next; `ready` must stay callable
  // while the generation lives.
  virtual bool SetReadyCallback(std::function<void()> ready) {
    (void)ready;
    return false;
  }
  // Push mode: moves the events queued to `out`, in order, without waiting.
  // Any thread, never concurrently with itself (the session serializes it).
  virtual void Poll(std::vector<GenerationEvent>* out) { (void)out; }
};

class Orchestrator {
 public:
  virtual ~Orchestrator() = default;

  // Starts `job` on the workers. Returns once the generation is placed (the
  // router: KV reserved on a decode worker, prefill dispatched); tokens then
  // come from Generation::Next. Refusals: RESOURCE_EXHAUSTED (every worker is
  // full), UNAVAILABLE (a pool is empty or draining), INVALID_ARGUMENT (a
  // worker refused the input), each marked with a reject reason
  // (frontend/errors.h). Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<Generation>> Start(GenerationJob job) = 0;
};

}  // namespace pdserve::frontend
