// The prefill worker's engine: the scheduler core (engine/scheduler) in its
// prefill role. Prompts are queued and admitted while their blocks fit,
// batched up to a token budget (optionally in chunks); in a prompt's last
// step each layer is queued on the request's KV session by descriptor
// (layer, tokens, the prompt's blocks) as soon as the layer is in the cache
// (on a device backend: ordered after the layer's compute event, without
// waiting on the host), while the runner computes the next one; the first
// token is sampled by the runner and handed back at once (time to first
// token ends there). A prompt's blocks are held until the transport reports
// them read (the session's `done`), then released.
// The KV session is not opened while a prompt waits: the caller opens it
// when the ticket says the prompt started (PrefillTicket::Await) and
// attaches it (AttachKvSession), so connections to decode workers exist only
// for prompts being computed. A prompt computed before its session arrived
// holds its blocks, and its layers and first token go out on attachment.
// With prefix caching, a prompt starts after the longest prefix whose blocks
// are still cached (in use by another prompt, or evictable), its own full
// blocks stay cached once released, and the KV sent still covers the whole
// prompt (cached blocks are read like any other).
//
// The step loop is the EngineCore's (engine/core/engine_core.h); this class
// is the prefill role's policy over it: what a step carries (the prompts'
// KV sessions), how it runs (each layer queued on the sessions while the next
// computes), how its results are applied and handed out (tickets, KV sends).
// Freeing a prompt's blocks once its send is done wakes the loop at once, so
// a prompt waiting for blocks starts then.
//
// Threads: the core's engine thread plans, runs and applies steps; gRPC
// handler threads Submit, wait on their ticket and Cancel; KV send
// completion (which releases the blocks) runs on transport threads. The
// core's lock guards the scheduler and the job table; a send tracker's lock
// is taken before it, never while holding it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/core/engine_core.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sampler.h"
#include "engine/scheduler/scheduler.h"
#include "kvtransfer/transport.h"
#include "prefill_worker/prefill_metrics.h"

namespace pdserve::prefill {

struct PrefillRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  // A continuation (the request's decode worker failed): tokens already
  // generated. They are computed after the prompt, their KV is sent with
  // the prompt's, and the token sampled is number generated.size() (they
  // count toward max_tokens, min_tokens and the penalties).
  std::vector<int32_t> generated;
  engine::SamplingParams sampling;
  // A session opened up front (in-process callers and tests); null: the
  // caller attaches one once the request starts (AttachKvSession).
  std::unique_ptr<kvtransfer::SendSession> kv_session;
};

struct PrefillOutcome {
  engine::SampledToken first_token;
  double queue_seconds = 0;
  double compute_seconds = 0;
};

// Where a submitted request stands.
struct PrefillProgress {
  bool started = false;  // its first step began
  std::optional<absl::StatusOr<PrefillOutcome>> result;
};

// Handle of one submitted request: its place in the queue when it was
// accepted, then whether it started and how it ended.
class PrefillTicket {
 public:
  PrefillTicket(int queue_position, int64_t tokens_ahead)
      : queue_position_(queue_position), tokens_ahead_(tokens_ahead) {}
  int queue_position() const { return queue_position_; }  // prompts ahead when accepted
  int64_t tokens_ahead() const { return tokens_ahead_; }  // their tokens

  // Waits up to `timeout` for a result, or for the start when
  // `started_seen` is false; returns where the request stands.
  PrefillProgress Await(absl::Duration timeout, bool started_seen);
  // Waits up to `timeout`; true with *out set once the request completed.
  bool Wait(absl::Duration timeout, absl::StatusOr<PrefillOutcome>* out);
  void Start();
  void Complete(absl::StatusOr<PrefillOutcome> result);

 private:
  const int queue_position_;
  const int64_t tokens_ahead_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::StatusOr<PrefillOutcome>> result_ ABSL_GUARDED_BY(mu_);
};

struct PrefillEngineOptions {
  int max_batch_tokens = 4096;  // prompt tokens per step (a longer unchunked prompt runs alone)
  int max_prefill_chunk_tokens = 0;  // 0: prompts run whole; else chunks of at most this
  // Steps last about this long: their new tokens are capped at the measured
  // rate times this, never below one chunk (a whole prompt unchunked) nor
  // above max_batch_tokens. Bounds how long a cancelled prompt, or a newly
  // arrived one, waits for the step in progress. Zero: max_batch_tokens.
  absl::Duration step_target = absl::ZeroDuration();
  int max_queued_requests = 1024;  // beyond: RESOURCE_EXHAUSTED
  bool enable_prefix_caching = true;
  double peak_flops = 0;  // FLOP/s for the MFU gauge; 0: unknown
  // How long the destructor waits for KV sends in flight to be acknowledged.
  absl::Duration send_drain_timeout = absl::Seconds(10);
};

struct PrefillLoad {
  int64_t queued_tokens = 0;  // waiting and running, cached prefixes not counted
  int queued_requests = 0;
  // With prefix caching: the KV cache's digest for routers
  // (KvCacheManager::CachedHashDigest).
  std::vector<uint64_t> cached_block_hashes;
  // Progress (the router's liveness judgement): steps completed plus layers
  // computed since start, whether prompts wait or run, prompt tokens
  // computed per second over recent steps, and why the engine cannot serve
  // (empty: it can).
  uint64_t progress = 0;
  bool has_work = false;
  double tokens_per_second = 0;
  std::string unhealthy_reason;
};

class PrefillEngine : private engine::EnginePolicy {
 public:
  // `runner` and `metrics` must outlive the engine.
  PrefillEngine(PrefillEngineOptions options, engine::ModelRunner* runner, PrefillMetrics* metrics);
  ~PrefillEngine() override;  // fails queued requests, waits for sends in flight, joins

  // The spec a receiver expects for a prompt of `num_tokens`.
  kvtransfer::TransferSpec SpecFor(int num_tokens) const;
  const engine::ModelConfig& model_config() const { return runner_->config(); }

  // INVALID_ARGUMENT for bad input; RESOURCE_EXHAUSTED when the queue is full.
  absl::StatusOr<std::shared_ptr<PrefillTicket>> Submit(PrefillRequest request);
  // The KV session of a started request (or why it could not be opened:
  // the request then fails with that status once computed). A request
  // computed before its session arrived sends its KV and completes here.
  // No effect (the session is aborted) once the ticket completed.
  void AttachKvSession(const std::shared_ptr<PrefillTicket>& ticket,
                       absl::StatusOr<std::unique_ptr<kvtransfer::SendSession>> session);
  // Drops the request: at once if it waits, else at the end of the step it
  // is in (a chunked prompt stops at the next chunk). No effect once the
  // ticket completed.
  void Cancel(const std::shared_ptr<PrefillTicket>& ticket);

  PrefillLoad load() const;
  // How the engine loop's idle waits ended (tests).
  engine::WakeStats wake_stats() const { return core_.wake_stats(); }

 private:
  struct Job {
    std::string request_id;
    // Attached by the caller once the request started; null until then.
    std::unique_ptr<kvtransfer::SendSession> kv_session;
    absl::Status kv_open_error;  // the session could not be opened
    std::shared_ptr<PrefillTicket> ticket;
    int prompt_len = 0;  // tokens whose KV is sent: prompt + generated
    absl::Time enqueued;
    absl::Time started;  // first step that computed it
    bool started_set = false;
  };
  // A computed prompt whose session had not arrived: blocks held, first
  // token kept, until AttachKvSession (or Cancel, or shutdown).
  struct Deferred {
    engine::SeqId id = 0;
    Job job;
    engine::SampledToken first;
    std::vector<int32_t> block_table;
    absl::Time compute_end;
    double compute_seconds = 0;
  };
  // KV sends whose receiver ack is pending. Shared with the sends' completion
  // callbacks, which may outlive the engine: after the engine is gone they
  // no longer touch its metrics or blocks.
  struct SendTracker {
    absl::Mutex mu;
    int in_flight ABSL_GUARDED_BY(mu) = 0;
    PrefillMetrics* metrics ABSL_GUARDED_BY(mu) = nullptr;  // null once the engine is gone
    PrefillEngine* engine ABSL_GUARDED_BY(mu) = nullptr;    // likewise
    // Finished sessions awaiting their ack, by key; keys of acknowledged ones.
    std::unordered_map<uint64_t, std::unique_ptr<kvtransfer::SendSession>> sessions
        ABSL_GUARDED_BY(mu);
    std::vector<uint64_t> done_keys ABSL_GUARDED_BY(mu);
    uint64_t next_key ABSL_GUARDED_BY(mu) = 0;
  };

  class Step;
  // EnginePolicy (on the engine thread, under the core's lock).
  void OnPlanned(const engine::ScheduledStep& step, double plan_seconds) override;
  std::unique_ptr<engine::EngineStep> BeginStep(const engine::ScheduledStep& step,
                                                absl::Time now) override;
  void UpdateGauges() override { UpdateGaugesLocked(); }
  // Queues every layer of a computed prompt on its session, then hands it
  // out (FinishJob); on a send failure releases the blocks and fails it.
  void SendAllAndFinish(Deferred d);
  // Hands a finished prompt's first token out and its session to the
  // tracker; the blocks of sequence `id` are released when the send is done.
  void FinishJob(engine::SeqId id, Job& job, engine::SampledToken first, size_t sent_bytes,
                 absl::Time transfer_start, absl::Time compute_end, double compute_seconds);
  // The transport no longer reads the blocks of held sequence `id`.
  void ReleaseSource(engine::SeqId id);
  void UpdateGaugesLocked();

  const PrefillEngineOptions options_;
  engine::ModelRunner* const runner_;
  PrefillMetrics* const metrics_;
  const std::shared_ptr<SendTracker> sends_;

  // Requests not yet answered, by sequence id; nodes stay put while a step
  // runs (only the engine thread erases a job that is in a step). Guarded by
  // the core's lock.
  std::unordered_map<engine::SeqId, Job> jobs_;
  std::unordered_map<engine::SeqId, Deferred> deferred_;
  // Layers computed within steps (without the lock): progress a long prompt
  // step shows before it completes.
  std::atomic<uint64_t> layers_computed_{0};
  engine::SeqId next_seq_ = 1;
  engine::EngineCore core_;  // last: its thread runs the policy over everything above
};

}  // namespace pdserve::prefill
