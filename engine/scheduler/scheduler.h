// The continuous-batching core every role runs on: sequence state, the KV
// cache manager, and one step at a time planned by PlanStep
// (engine/scheduler/plan_step.h). Roles are policies of the same core:
//
//   kPrefill    prompts are queued, computed (whole or in chunks), and the
//               first token sampled; the sequence then holds its blocks
//               until the KV transfer has read them (Release).
//   kDecode     a sequence is admitted with blocks reserved for its whole
//               request while its prompt's KV arrives from a prefill worker
//               (AddRemote); with the KV and the first token in
//               (StartDecoding) it decodes one token per step.
//   kColocated  prompts are queued, prefilled and decoded in one process;
//               blocks for prompt + max_tokens are reserved at admission.
//
// Usage, on one engine thread under the engine's lock: Schedule() plans the
// next step, takes its blocks and returns the StepBatch; the engine runs it
// on the ModelRunner without the lock; Complete() applies the result and
// returns one update per sequence of the step. Other threads add, cancel and
// release sequences under the same lock. A sequence in a step is never freed
// under the runner: Cancel marks it and Complete frees it.
//
// No abort path: every input either fits or waits; a request that can never
// fit is refused when added.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/model/config.h"
#include "engine/runtime/finish.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sampler.h"
#include "engine/scheduler/plan_step.h"

namespace pdserve::engine {

enum class SchedulerRole { kPrefill, kDecode, kColocated };
std::string_view SchedulerRoleName(SchedulerRole role);

struct SchedulerOptions {
  SchedulerRole role = SchedulerRole::kColocated;
  PlanOptions plan;
};

// What happened to one sequence of a completed step.
struct SequenceUpdate {
  SeqId id = 0;
  // A sampled token (the first one for a prompt), when the step sampled.
  std::optional<SampledToken> token;
  // kNone while the sequence goes on.
  FinishReason finish = FinishReason::kNone;
  // Non-OK: the step failed for this sequence; it has been freed.
  absl::Status error;
  // The sequence was cancelled during the step and has been freed.
  bool cancelled = false;
  // The sequence is gone (finished, failed or cancelled): its blocks are free.
  bool freed = false;
};

// One planned step: the batch for the runner and what it covers.
struct ScheduledStep {
  std::vector<SeqId> ids;           // batch order
  std::vector<bool> admitted;       // came from the waiting queue in this step
  std::vector<int> num_new_tokens;  // per sequence
  StepBatch batch;                  // spans into the scheduler's sequences
  int num_tokens = 0;               // new tokens of the step
  bool empty() const { return ids.empty(); }
};

class Scheduler {
 public:
  enum class State { kWaiting, kAwaitingKv, kRunning, kHeld };
  struct Sequence {
    SeqId id = 0;
    std::vector<int32_t> tokens;  // prompt, then generated tokens
    int prompt_len = 0;
    int num_computed = 0;    // tokens whose K/V is in the cache
    int reserve_tokens = 0;  // tokens reserved at admission
    SamplingParams sampling;
    State state = State::kWaiting;
    bool in_step = false;
    bool cancelled = false;
    std::vector<int32_t> block_table;  // copy of the cache manager's

    int num_generated() const { return static_cast<int>(tokens.size()) - prompt_len; }
  };

  // `config` must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, const ModelConfig& config, int num_blocks,
            int block_size);

  // kPrefill, kColocated: queues a prompt. INVALID_ARGUMENT when its
  // reservation needs more blocks than the whole cache (it could never run),
  // ALREADY_EXISTS for a known id.
  absl::Status AddPrompt(SeqId id, std::vector<int32_t> prompt, SamplingParams sampling);
  // kDecode: admits a sequence whose prompt KV will be written from outside
  // into the returned blocks, reserving `reserve_tokens` tokens now.
  // RESOURCE_EXHAUSTED when the blocks or max_num_seqs run out.
  absl::StatusOr<std::span<const int32_t>> AddRemote(SeqId id, std::vector<int32_t> prompt,
                                                     SamplingParams sampling, int reserve_tokens);
  // kDecode: the prompt's KV and the first token arrived. Returns the first
  // token's finish reason; when not kNone the sequence is freed.
  absl::StatusOr<FinishReason> StartDecoding(SeqId id, int32_t first_token);
  // kPrefill: frees a held sequence once its KV has been read.
  void Release(SeqId id);
  // Frees the sequence now, or after the step it is in (then Complete
  // reports it cancelled). True when it was freed now; false when deferred
  // or unknown.
  bool Cancel(SeqId id);

  // Plans the next step and takes its blocks. Empty when nothing can run.
  ScheduledStep Schedule();
  // Applies a finished step (its result, or the error that failed it).
  std::vector<SequenceUpdate> Complete(ScheduledStep& step,
                                       const absl::StatusOr<StepOutput>& result);

  const Sequence* Find(SeqId id) const;
  const KvCacheManager& kv() const { return kv_; }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return num_in_state_[static_cast<int>(State::kRunning)]; }
  int num_awaiting_kv() const { return num_in_state_[static_cast<int>(State::kAwaitingKv)]; }
  int num_held() const { return num_in_state_[static_cast<int>(State::kHeld)]; }
  // Sequences holding blocks (running, awaiting KV, held).
  int num_holding() const { return static_cast<int>(admitted_.size()); }
  // Uncomputed prompt tokens of waiting and running sequences.
  int64_t pending_prompt_tokens() const;

 private:
  void SetState(Sequence& seq, State state);
  void FreeSequence(SeqId id);
  PlanSeq ToPlanSeq(const Sequence& seq) const;

  const SchedulerOptions options_;
  const ModelConfig& config_;
  KvCacheManager kv_;
  // Node-based: pointers and spans into a Sequence stay valid until it is
  // erased, which never happens while it is in a step.
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<SeqId> waiting_;   // arrival order
  std::vector<SeqId> admitted_;  // admission order: running, awaiting KV, held
  int num_in_state_[4] = {0, 0, 0, 0};
};

}  // namespace pdserve::engine
