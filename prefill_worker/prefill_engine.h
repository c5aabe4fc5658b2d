// The prefill worker's engine: queues prompts, batches them up to a token
// budget, runs one prefill per batch, streams each layer's KV to the decode
// worker named by the request as soon as the layer is computed, samples the
// first token and hands it back at once (time to first token ends there).
//
// Threads: one engine thread runs batches; gRPC handler threads Submit,
// wait on their ticket and Cancel; KV send completion runs on transport
// threads. `mu_` guards the queue and the block manager.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sampler.h"
#include "kvtransfer/transport.h"
#include "prefill_worker/prefill_metrics.h"

namespace pdserve::prefill {

struct PrefillRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;
  // Open session to the decode worker's receiver for this request.
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
  int max_batch_tokens = 4096;      // prompt tokens per batch (a longer prompt runs alone)
  int max_queued_requests = 1024;   // beyond: RESOURCE_EXHAUSTED
  double peak_flops = 0;            // FLOP/s for the MFU gauge; 0: unknown
};

struct PrefillLoad {
  int64_t queued_tokens = 0;  // waiting and running
  int queued_requests = 0;
};

class PrefillEngine {
 public:
  // `runner` and `metrics` must outlive the engine.
  PrefillEngine(PrefillEngineOptions options, engine::ModelRunner* runner, PrefillMetrics* metrics);
  ~PrefillEngine();  // fails queued requests, waits for sends in flight, joins

  // The spec a receiver expects for a prompt of `num_tokens`.
  kvtransfer::TransferSpec SpecFor(int num_tokens) const;

  // INVALID_ARGUMENT for bad input; RESOURCE_EXHAUSTED when the queue is full.
  absl::StatusOr<std::shared_ptr<PrefillTicket>> Submit(PrefillRequest request);
  // Drops the request if it has not started; a running batch completes.
  void Cancel(const std::shared_ptr<PrefillTicket>& ticket);

  PrefillLoad load() const;

 private:
  struct Job {
    PrefillRequest request;
    std::shared_ptr<PrefillTicket> ticket;
    absl::Time enqueued;
  };
  // A finished session whose receiver ack is pending; reaped by the loop.
  struct Sending {
    std::unique_ptr<kvtransfer::SendSession> session;
    std::shared_ptr<std::atomic<bool>> done;
  };

  void Loop();
  void RunBatch(std::vector<Job>& batch);
  void ReapSendsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PrefillEngineOptions options_;
  engine::ModelRunner* const runner_;
  PrefillMetrics* const metrics_;

  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t running_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int running_requests_ ABSL_GUARDED_BY(mu_) = 0;
  engine::KvCacheManager blocks_ ABSL_GUARDED_BY(mu_);
  engine::SeqId next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<Sending> sending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: runs Loop() over everything above
};

}  // namespace pdserve::prefill
