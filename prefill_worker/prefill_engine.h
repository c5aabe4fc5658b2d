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
// With prefix caching, a prompt starts after the longest prefix whose blocks
// are still cached (in use by another prompt, or evictable), its own full
// blocks stay cached once released, and the KV sent still covers the whole
// prompt (cached blocks are read like any other).
//
// Threads: one engine thread plans, runs and applies steps; gRPC handler
// threads Submit, wait on their ticket and Cancel; KV send completion (which
// releases the blocks) runs on transport threads. `mu_` guards the scheduler
// and the job table; a send tracker's lock is taken before `mu_`, never
// while holding it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
  // Open session to the decode worker's receiver for this request
  // (prompt + generated tokens).
  std::unique_ptr<kvtransfer::SendSession> kv_session;
};

struct PrefillOutcome {
  engine::SampledToken first_token;
  double queue_seconds = 0;
  double compute_seconds = 0;
};

// Completion handle of one submitted request.
class PrefillTicket {
 public:
  // Waits up to `timeout`; true with *out set once the request completed.
  bool Wait(absl::Duration timeout, absl::StatusOr<PrefillOutcome>* out);
  void Complete(absl::StatusOr<PrefillOutcome> result);

 private:
  absl::Mutex mu_;
  std::optional<absl::StatusOr<PrefillOutcome>> result_ ABSL_GUARDED_BY(mu_);
};

struct PrefillEngineOptions {
  int max_batch_tokens = 4096;  // prompt tokens per step (a longer unchunked prompt runs alone)
  int max_prefill_chunk_tokens = 0;  // 0: prompts run whole; else chunks of at most this
  int max_queued_requests = 1024;    // beyond: RESOURCE_EXHAUSTED
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
};

class PrefillEngine {
 public:
  // `runner` and `metrics` must outlive the engine.
  PrefillEngine(PrefillEngineOptions options, engine::ModelRunner* runner, PrefillMetrics* metrics);
  ~PrefillEngine();  // fails queued requests, waits for sends in flight, joins

  // The spec a receiver expects for a prompt of `num_tokens`.
  kvtransfer::TransferSpec SpecFor(int num_tokens) const;
  const engine::ModelConfig& model_config() const { return runner_->config(); }

  // INVALID_ARGUMENT for bad input; RESOURCE_EXHAUSTED when the queue is full.
  absl::StatusOr<std::shared_ptr<PrefillTicket>> Submit(PrefillRequest request);
  // Drops the request: at once if it waits, else at the end of the step it
  // is in (a chunked prompt stops at the next chunk). No effect once the
  // ticket completed.
  void Cancel(const std::shared_ptr<PrefillTicket>& ticket);

  PrefillLoad load() const;

 private:
  struct Job {
    std::string request_id;
    std::unique_ptr<kvtransfer::SendSession> kv_session;
    std::shared_ptr<PrefillTicket> ticket;
    int prompt_len = 0;  // tokens whose KV is sent: prompt + generated
    absl::Time enqueued;
    absl::Time started;  // first step that computed it
    bool started_set = false;
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

  void Loop();
  // Runs `step` on the runner, staging each layer of the prompts it finishes
  // into their KV sessions; returns the step's result.
  absl::StatusOr<engine::StepOutput> RunStep(engine::ScheduledStep& step,
                                             const std::vector<Job*>& jobs,
                                             std::vector<absl::Status>& send_status,
                                             std::vector<size_t>& sent_bytes,
                                             absl::Time& first_layer_sent);
  // Hands a finished prompt's first token out and its session to the
  // tracker; the blocks of sequence `id` are released when the send is done.
  void FinishJob(engine::SeqId id, Job& job, engine::SampledToken first, size_t sent_bytes,
                 absl::Time transfer_start, absl::Time compute_end, double compute_seconds);
  // The transport no longer reads the blocks of held sequence `id`.
  void ReleaseSource(engine::SeqId id);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PrefillEngineOptions options_;
  engine::ModelRunner* const runner_;
  PrefillMetrics* const metrics_;
  const std::shared_ptr<SendTracker> sends_;

  mutable absl::Mutex mu_;
  engine::Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  // Requests not yet answered, by sequence id; nodes stay put while a step
  // runs (only the engine thread erases a job that is in a step).
  std::unordered_map<engine::SeqId, Job> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t running_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int running_requests_ ABSL_GUARDED_BY(mu_) = 0;
  engine::SeqId next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // work arrived since the last plan
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: runs Loop() over everything above
};

}  // namespace pdserve::prefill
