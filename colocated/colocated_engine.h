// The colocated engine: prefill and decode on one ModelRunner, in one loop,
// for comparison with the disaggregated pools (bench/loadgen,
// docs/performance.md). It is the scheduler core (engine/scheduler) in its
// colocated role. By default it is scheduled as vLLM v0 was: each step is
// either prompt work (newly admitted prompts) or one decode step over every
// running sequence, prompts first whenever one fits, so a long prompt stalls
// every running decode: the interference disaggregation removes. With
// max_prefill_chunk_tokens > 0, prompts run in chunks that share steps with
// the running decodes instead.
//
// Admission reserves KV blocks for the prompt plus a headroom; sequences take
// blocks as they grow, and when blocks run out the newest are preempted and
// later recomputed (engine/scheduler/scheduler.h). A prompt that does not
// fit waits for blocks. With prefix caching, a prompt starts after its
// longest cached prefix.
//
// Threads: one engine thread plans, runs and applies steps; gRPC handler
// threads Submit, read their stream and Cancel. `mu_` guards the scheduler
// and the stream table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "colocated/colocated_metrics.h"
#include "common/base/output_queue.h"
#include "engine/runtime/finish.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sampler.h"
#include "engine/scheduler/scheduler.h"

namespace pdserve::colocated {

struct ColocatedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;
};

// One message for the request's stream.
struct ColocatedOutput {
  std::vector<int32_t> tokens;  // generated since the previous output (the first token included)
  bool finished = false;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  double queue_seconds = 0;  // submit to prefill start; set with the first token
  absl::Status error;        // non-OK ends the stream with this status
};

// Per-request output queue, filled by the engine, drained by the handler.
class ColocatedStream : public OutputQueue<ColocatedOutput> {
 public:
  explicit ColocatedStream(engine::SeqId seq) : seq_(seq) {}
  engine::SeqId seq() const { return seq_; }

 private:
  const engine::SeqId seq_;
};

struct ColocatedOptions {
  int max_running = 256;          // sequences holding KV
  int max_prefill_tokens = 4096;  // new tokens per step (an unchunked head prompt may exceed it)
  int max_waiting = 1024;         // queued prompts before RESOURCE_EXHAUSTED
  // 0: whole prompts in steps of their own (vLLM v0); else prompts run in
  // chunks of at most this many tokens, mixed into decode steps.
  int max_prefill_chunk_tokens = 0;
  bool enable_prefix_caching = true;
  // Tokens reserved beyond the prompt at admission; negative: whole
  // requests (prompt + max_tokens - 1) up front.
  int kv_headroom_tokens = 32;
};

struct ColocatedLoad {
  int waiting = 0;  // new prompts and preempted sequences
  int running = 0;
  int free_blocks = 0;
  int total_blocks = 0;
};

class ColocatedEngine {
 public:
  // `runner` and `metrics` must outlive the engine.
  ColocatedEngine(ColocatedOptions options, engine::ModelRunner* runner, ColocatedMetrics* metrics);
  ~ColocatedEngine();  // fails everything still queued or running and joins the loop

  // Validates the request and queues it. INVALID_ARGUMENT for bad input or a
  // request larger than the whole KV cache, RESOURCE_EXHAUSTED when the
  // waiting queue is full, UNAVAILABLE after shutdown began.
  absl::StatusOr<std::shared_ptr<ColocatedStream>> Submit(ColocatedRequest request);
  // Stops the request and frees its blocks (now, or after the running step).
  void Cancel(const ColocatedStream& stream);

  ColocatedLoad load() const;

 private:
  // Per request: its stream and timing.
  struct Entry {
    std::shared_ptr<ColocatedStream> stream;
    absl::Time submitted;
    double queue_seconds = 0;  // submit to admission; sent with the first token
    bool first_sent = false;
  };

  void Loop();
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ColocatedOptions options_;
  engine::ModelRunner* const runner_;
  ColocatedMetrics* const metrics_;

  mutable absl::Mutex mu_;
  engine::Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<engine::SeqId, Entry> entries_ ABSL_GUARDED_BY(mu_);
  engine::SeqId next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // work arrived since the last plan
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: runs Loop() over everything above
};

}  // namespace pdserve::colocated
