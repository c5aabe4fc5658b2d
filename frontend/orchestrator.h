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
class Generation {
 public:
  // Cancels the generation if it has not finished; returns once nothing
  // refers to the object any more. Worker resources are released, or their
  // release is under way.
  virtual ~Generation() = default;

  // Appends the events that arrived to `out`, waiting up to `timeout` while
  // there are none. OK with nothing appended: the timeout passed. An error
  // status: the generation failed (what it produced before was returned by
  // earlier calls); its message is for the client. Not called again after
  // an event with `finished` or an error.
  virtual absl::Status Next(absl::Duration timeout, std::vector<GenerationEvent>* out) = 0;

  // Stops the generation and frees what it holds on the workers.
  // Idempotent; a Next after it returns CANCELLED (or events already queued).
  virtual void Cancel() = 0;

  // The workers serving it now (may change if the orchestration moves it).
  virtual Placement placement() const = 0;
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
