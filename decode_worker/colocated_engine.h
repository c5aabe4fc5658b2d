// The colocated engine: prefill and decode on one ModelRunner, in one loop,
// for comparison with the disaggregated pools (bench/loadgen,
// docs/performance.md). vLLM-v0 style: each step is either a prefill batch
// of newly admitted prompts or one decode step over every running sequence,
// and prefill goes first whenever a waiting prompt can be admitted, so a long
// prompt stalls every running decode: the interference disaggregation
// removes.
//
// Each step is planned (PlanStep, pure), run without the lock, and its
// results applied. Admission reserves KV blocks for prompt + max_tokens - 1
// tokens at once, so a running sequence never needs preempting; a prompt that
// does not fit waits for blocks to be freed by finishing sequences.
//
// Threads: one engine thread owns the step loop and the runner; gRPC handler
// threads Submit, read their stream and Cancel. `mu_` guards all sequence
// state and the block manager.
#pragma once

#include <cstdint>
#include <deque>
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
#include "common/output_queue.h"
#include "decode_worker/colocated_metrics.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/runtime/finish.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sampler.h"

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
  int max_running = 256;          // sequences in the decode batch
  int max_prefill_tokens = 4096;  // prompt tokens per prefill step (the head always runs)
  int max_waiting = 1024;         // queued prompts before RESOURCE_EXHAUSTED
};

struct ColocatedLoad {
  int waiting = 0;
  int running = 0;
  int free_blocks = 0;
  int total_blocks = 0;
};

// What one step does; the output of PlanStep.
struct StepPlan {
  enum class Kind { kIdle, kPrefill, kDecode };
  Kind kind = Kind::kIdle;
  // kPrefill: how many sequences from the head of the waiting queue.
  int num_prefill = 0;
};

// Pure planning: prefill the longest prefix of the waiting queue that fits
// the token budget, the free blocks and the running limit (the head alone may
// exceed the token budget); otherwise decode if anything runs.
// `waiting_tokens[i]`: prompt tokens of the i-th waiting sequence;
// `waiting_blocks[i]`: blocks it needs for prompt + max_tokens - 1 tokens.
StepPlan PlanStep(const std::vector<int>& waiting_tokens, const std::vector<int>& waiting_blocks,
                  int free_blocks, int num_running, const ColocatedOptions& options);

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
  enum class State { kWaiting, kRunning };
  struct Sequence {
    std::string request_id;
    engine::SamplingParams sampling;
    std::vector<int32_t> prompt;
    std::vector<int32_t> block_table;  // copy: stable while the sequence lives
    State state = State::kWaiting;
    int32_t last_token = 0;          // newest token, not yet in the cache
    int position = 0;                // position of last_token
    std::vector<int32_t> generated;  // output so far (penalties and min_tokens read it)
    bool cancelled = false;
    bool in_step = false;  // part of the step being computed
    absl::Time submitted;
    std::shared_ptr<ColocatedStream> stream;
  };

  void Loop();
  // Runs one prefill batch or decode step over `ids` (all marked in_step).
  void RunPrefill(const std::vector<engine::SeqId>& ids);
  void RunDecode(const std::vector<engine::SeqId>& ids);
  // Sample/finish bookkeeping after a step, under mu_.
  void ApplyTokenLocked(engine::SeqId id, Sequence& seq, int32_t token, double queue_seconds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeLocked(engine::SeqId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a step that ran `seq`: clears in_step, frees a cancelled sequence,
  // and fails and frees it when the step failed (`what` names the step).
  // True when the sequence goes on and its step's token should be applied.
  bool SettleLocked(engine::SeqId id, Sequence& seq, const absl::Status& step, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int ReserveTokens(const Sequence& seq) const;

  const ColocatedOptions options_;
  engine::ModelRunner* const runner_;
  ColocatedMetrics* const metrics_;

  mutable absl::Mutex mu_;
  engine::KvCacheManager blocks_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<engine::SeqId, Sequence> seqs_ ABSL_GUARDED_BY(mu_);
  std::deque<engine::SeqId> waiting_ ABSL_GUARDED_BY(mu_);  // FCFS
  std::vector<engine::SeqId> running_ ABSL_GUARDED_BY(mu_);
  engine::SeqId next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: runs Loop() over everything above
};

}  // namespace pdserve::colocated
