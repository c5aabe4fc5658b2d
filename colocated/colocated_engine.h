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
// The step loop is the EngineCore's (engine/core/engine_core.h); this class
// is the colocated role's policy over it.
//
// Threads: the core's engine thread plans, runs and applies steps; gRPC
// handler threads Submit, read their stream and Cancel. The core's lock
// guards the scheduler and the stream table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "colocated/colocated_metrics.h"
#include "common/base/output_queue.h"
#include "engine/core/engine_core.h"
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
  // One per token, with its log-probabilities, when the request asked for
  // them (sampling.logprobs >= 0).
  std::vector<engine::SampledToken> logprobs;
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
  // Hand a step's tokens out while the next step computes
  // (EngineCoreOptions::overlap_delivery).
  bool overlap_delivery = true;
};

struct ColocatedLoad {
  int waiting = 0;  // new prompts and preempted sequences
  int running = 0;
  int free_blocks = 0;
  int total_blocks = 0;
};

class ColocatedEngine : private engine::EnginePolicy {
 public:
  // `runner` and `metrics` must outlive the engine.
  ColocatedEngine(ColocatedOptions options, engine::ModelRunner* runner, ColocatedMetrics* metrics);
  ~ColocatedEngine() override;  // fails everything still queued or running and joins the loop

  // Validates the request and queues it. INVALID_ARGUMENT for bad input or a
  // request larger than the whole KV cache, RESOURCE_EXHAUSTED when the
  // waiting queue is full, UNAVAILABLE after shutdown began.
  absl::StatusOr<std::shared_ptr<ColocatedStream>> Submit(ColocatedRequest request);
  // Stops the request and frees its blocks (now, or after the running step).
  void Cancel(const ColocatedStream& stream);

  ColocatedLoad load() const;
  // How long the engine loop spent handing tokens out (bench/overlap_bench.cc).
  engine::DeliveryStats delivery_stats() const { return core_.delivery_stats(); }

 private:
  // Per request: its stream and timing.
  struct Entry {
    std::shared_ptr<ColocatedStream> stream;
    absl::Time submitted;
    double queue_seconds = 0;  // submit to admission; sent with the first token
    bool first_sent = false;
    bool logprobs = false;  // the request asked for log-probabilities
  };

  class Step;
  // EnginePolicy (on the engine thread, under the core's lock).
  void OnPlanned(const engine::ScheduledStep& step, double plan_seconds) override;
  std::unique_ptr<engine::EngineStep> BeginStep(const engine::ScheduledStep& step,
                                                absl::Time now) override;
  void UpdateGauges() override { UpdateGaugesLocked(); }
  void UpdateGaugesLocked();

  const ColocatedOptions options_;
  engine::ModelRunner* const runner_;
  ColocatedMetrics* const metrics_;

  // Guarded by the core's lock.
  std::unordered_map<engine::SeqId, Entry> entries_;
  engine::SeqId next_seq_ = 1;
  engine::EngineCore core_;  // last: its thread runs the policy over everything above
};

}  // namespace pdserve::colocated
